//! GGUF reader: parses the header with every count, length and offset checked against the
//! bytes actually present, then lends tensor data straight out of the memory map.
//!
//! Layout (gguf.cpp in llama.cpp b11434): magic `GGUF`, version u32 (2 or 3), tensor count
//! u64, metadata count u64, metadata entries, tensor infos, padding to `general.alignment`,
//! then the data section, where tensor `i` starts at the running sum of the padded sizes of
//! tensors `0..i` (gguf.cpp refuses any other placement, and so do we).

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use crate::types::GgmlType;
use crate::value::{Array, Value, ValueType};
use crate::{GgufError, Result};

/// The most entries (metadata, tensors) reserved before they parse.
const RESERVE_ENTRIES: usize = 4096;

/// Most metadata entries and most tensors a file may declare. An entry takes about 200 bytes
/// in memory from as few as 14 on disk, so without a cap a file of nothing but tiny keys made
/// the parsed header 10 times its own size (a 95 MB file, 955 MB). Real files hold tens of keys
/// and at most a few thousand tensors.
pub const MAX_ENTRIES: u64 = 1 << 16;
/// Most strings all of a file's string arrays may hold together: a String takes 24 bytes and
/// an allocation from as few as 8 on disk. A real vocabulary is a few hundred thousand tokens
/// and as many merges.
pub const MAX_ARRAY_STRINGS: usize = 8 << 20;

/// `GGUF` read as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Default data alignment when `general.alignment` is absent (`GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a ggml tensor has (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Longest tensor name ggml accepts, terminator excluded (`GGML_MAX_NAME` - 1).
pub const MAX_TENSOR_NAME: usize = 63;

/// One tensor's header entry.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous (row) dimension.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Bytes of tensor data.
    pub n_bytes: u64,
    /// Which file of a split model holds the bytes: 0 for the first (or only) file.
    pub shard: u16,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

enum Source {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Source {
    fn bytes(&self) -> &[u8] {
        match self {
            Source::Mmap(m) => m,
            Source::Owned(v) => v,
        }
    }
}

/// An opened GGUF file: parsed header, tensor data borrowed from the map. A split model (the
/// first of its shards opened with [`Gguf::open`]) is one `Gguf` too: the first shard's
/// metadata and every shard's tensors.
pub struct Gguf {
    source: Source,
    /// The other shards of a split model, in order (the second file first), with the absolute
    /// offset of each one's data section.
    more: Vec<(Source, u64)>,
    pub version: u32,
    pub alignment: u64,
    /// Absolute file offset of the (first file's) data section.
    pub data_offset: u64,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("shards", &self.n_shards())
            .finish()
    }
}

impl Gguf {
    /// Open and memory-map a GGUF file. When it is the first shard of a split model (`split.count`
    /// above 1, as llama.cpp's `gguf-split` and the converter's `--split-max-*` write them), the
    /// other shards are found beside it by llama.cpp's names (`PREFIX-00002-of-00003.gguf`) and
    /// opened too: see [`crate::split`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let first = Self::open_file(path)?;
        match crate::split::count(&first)? {
            Some(n) if n > 1 => first.with_shards(path, n),
            _ => Ok(first),
        }
    }

    /// Open and memory-map one file, whatever its `split.*` keys say.
    pub fn open_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path)
            .map_err(|e| GgufError::Io(format!("cannot open {}: {e}", path.display())))?;
        let len = file
            .metadata()
            .map_err(|e| GgufError::Io(format!("cannot stat {}: {e}", path.display())))?
            .len();
        if len == 0 {
            return Err(GgufError::Format(format!(
                "{} is empty, not a GGUF file",
                path.display()
            )));
        }
        // SAFETY: the map is read-only and lives as long as `Gguf`. The only hazard is another
        // process truncating or rewriting the file while it is mapped (SIGBUS or changing
        // bytes); like llama.cpp's loader we accept that model files are not edited in place
        // while loaded. Every access below is bounds-checked against the mapped length.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| GgufError::Io(format!("cannot map {}: {e}", path.display())))?;
        Self::from_source(Source::Mmap(map))
    }

    /// Parse a GGUF image held in memory (tests, fuzzing, small files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::from_source(Source::Owned(bytes))
    }

    fn from_source(source: Source) -> Result<Self> {
        let h = parse_header(source.bytes())?;
        Ok(Gguf {
            source,
            more: Vec::new(),
            version: h.version,
            alignment: h.alignment,
            data_offset: h.data_offset,
            key_index: h
                .metadata
                .iter()
                .enumerate()
                .map(|(i, (k, _))| (k.clone(), i))
                .collect(),
            metadata: h.metadata,
            tensor_index: h
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect(),
            tensors: h.tensors,
        })
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor of this file (or of its shard of a split model), borrowed from the
    /// map (bounds were proven at open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let (bytes, data_offset) = self.shard(t.shard);
        let start = (data_offset + t.offset) as usize;
        &bytes[start..start + t.n_bytes as usize]
    }

    /// Where a tensor's bytes start in its file (the data section's offset plus the tensor's).
    pub fn tensor_file_offset(&self, t: &TensorInfo) -> u64 {
        self.shard(t.shard).1 + t.offset
    }

    fn shard(&self, i: u16) -> (&[u8], u64) {
        match i {
            0 => (self.source.bytes(), self.data_offset),
            _ => {
                let (s, off) = &self.more[i as usize - 1];
                (s.bytes(), *off)
            }
        }
    }

    /// Files this model was read from: 1, or a split model's shard count.
    pub fn n_shards(&self) -> usize {
        1 + self.more.len()
    }

    /// Total size in bytes of the file (of every shard, for a split model).
    pub fn file_size(&self) -> u64 {
        self.source.bytes().len() as u64
            + self
                .more
                .iter()
                .map(|(s, _)| s.bytes().len() as u64)
                .sum::<u64>()
    }

    /// Open the shards after the first (`self`, shard 0 of `n`, read from `path`) and take
    /// their tensors in, refusing what llama.cpp's loader refuses: a shard out of place, a
    /// tensor in two shards, a total that is not `split.tensors.count`.
    fn with_shards(mut self, path: &Path, n: u16) -> Result<Self> {
        let no = crate::split::number(&self, path)?;
        let paths = crate::split::paths(path, no, n)?;
        if no != 0 {
            return Err(GgufError::Format(format!(
                "{} is shard {} of {n} of a split model; open the first shard, {}",
                path.display(),
                no + 1,
                paths[0].display()
            )));
        }
        let expected = crate::split::tensor_count(&self, path)?;
        for (i, p) in paths.iter().enumerate().skip(1) {
            // Every error of a later shard names it and the model: the user opened the first.
            // (An I/O error names the file already.)
            let whose = |m: String, file: bool| {
                let file = if file {
                    format!("{}, ", p.display())
                } else {
                    String::new()
                };
                format!(
                    "{m} ({file}shard {} of {n} of the split model {})",
                    i + 1,
                    path.display()
                )
            };
            let g = Self::later_shard(p, i, n).map_err(|e| match e {
                GgufError::Io(m) => GgufError::Io(whose(m, false)),
                GgufError::Format(m) => GgufError::Format(whose(m, true)),
            })?;
            let total = self.tensors.len() + g.tensors.len();
            if total as u64 > MAX_ENTRIES {
                return Err(GgufError::Format(format!(
                    "the shards of {} hold more than {MAX_ENTRIES} tensors",
                    path.display()
                )));
            }
            for mut t in g.tensors {
                if let Some(&j) = self.tensor_index.get(&t.name) {
                    return Err(GgufError::Format(format!(
                        "tensor '{}' is in shard {} and again in shard {} ({})",
                        t.name,
                        self.tensors[j].shard as u32 + 1,
                        i + 1,
                        p.display()
                    )));
                }
                t.shard = i as u16;
                self.tensor_index.insert(t.name.clone(), self.tensors.len());
                self.tensors.push(t);
            }
            self.more.push((g.source, g.data_offset));
        }
        if self.tensors.len() as u64 != expected {
            return Err(GgufError::Format(format!(
                "the {n} shards of {} hold {} tensors, but split.tensors.count says {expected}",
                path.display(),
                self.tensors.len()
            )));
        }
        Ok(self)
    }

    /// Shard `i` (from 0) of `n`, read from `p`: a whole GGUF whose `split.no` is `i` and whose
    /// `split.count` is `n`.
    fn later_shard(p: &Path, i: usize, n: u16) -> Result<Self> {
        let g = Gguf::open_file(p)?;
        let got = crate::split::number(&g, p)?;
        if usize::from(got) != i {
            return Err(GgufError::Format(format!(
                "{} says it is shard {} (split.no {got}), expected shard {} of {n}",
                p.display(),
                got as u32 + 1,
                i + 1
            )));
        }
        match crate::split::count_in(&g, Some(p))? {
            Some(m) if m == n => Ok(g),
            m => Err(GgufError::Format(format!(
                "{} says its model has {} shards (split.count), the first shard says {n}: files of two different splits",
                p.display(),
                m.unwrap_or(1),
            ))),
        }
    }
}

struct Header {
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
}

/// A bounds-checked little-endian cursor.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Strings the file's string arrays may still hold (MAX_ARRAY_STRINGS in all).
    strings_left: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Format(format!(
                "truncated file: {} at byte {} needs {} bytes, only {} remain",
                what(),
                self.pos,
                n,
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(&|| format!("{} (length)", what()))?;
        if len > self.remaining() as u64 {
            return Err(GgufError::Format(format!(
                "{} claims a string of {len} bytes at byte {}, but only {} bytes remain",
                what(),
                self.pos,
                self.remaining()
            )));
        }
        let bytes = self.take(len as usize, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| GgufError::Format(format!("{} is not valid UTF-8", what())))
    }
}

fn read_scalar(c: &mut Cursor<'_>, ty: ValueType, what: &dyn Fn() -> String) -> Result<Value> {
    Ok(match ty {
        ValueType::U8 => Value::U8(c.array::<1>(what)?[0]),
        ValueType::I8 => Value::I8(c.array::<1>(what)?[0] as i8),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array(what)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array(what)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.array(what)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array(what)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array(what)?)),
        ValueType::Bool => {
            let b = c.array::<1>(what)?[0];
            match b {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                _ => {
                    return Err(GgufError::Format(format!(
                        "{} is a bool with byte value {b}",
                        what()
                    )));
                }
            }
        }
        ValueType::String => Value::String(c.string(what)?),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.array(what)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array(what)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array(what)?)),
        ValueType::Array => unreachable!("arrays are read by read_value"),
    })
}

fn read_value(c: &mut Cursor<'_>, ty: ValueType, key: &str) -> Result<Value> {
    if ty != ValueType::Array {
        return read_scalar(c, ty, &|| format!("the value of key '{key}'"));
    }
    let elem_id = c.u32(&|| format!("the element type of array '{key}'"))?;
    let elem = ValueType::from_id(elem_id).ok_or_else(|| {
        GgufError::Format(format!("array '{key}' has unknown element type {elem_id}"))
    })?;
    if elem == ValueType::Array {
        return Err(GgufError::Format(format!(
            "array '{key}' nests arrays, which GGUF readers do not support"
        )));
    }
    let count = c.u64(&|| format!("the length of array '{key}'"))?;
    // Bound the count by the bytes present before allocating anything.
    let max = (c.remaining() / elem.min_size()) as u64;
    if count > max {
        return Err(GgufError::Format(format!(
            "array '{key}' claims {count} elements of type {}, but only {} bytes remain (at most {max} elements)",
            elem.name(),
            c.remaining()
        )));
    }
    let n = count as usize;
    macro_rules! fixed {
        ($variant:ident, $t:ty) => {{
            let w = std::mem::size_of::<$t>();
            let raw = c.take(n * w, &|| format!("array '{key}'"))?;
            Array::$variant(
                raw.chunks_exact(w)
                    .map(|b| <$t>::from_le_bytes(b.try_into().unwrap_or_default()))
                    .collect(),
            )
        }};
    }
    let arr = match elem {
        ValueType::U8 => Array::U8(c.take(n, &|| format!("array '{key}'"))?.to_vec()),
        ValueType::I8 => Array::I8(
            c.take(n, &|| format!("array '{key}'"))?
                .iter()
                .map(|&b| b as i8)
                .collect(),
        ),
        ValueType::U16 => fixed!(U16, u16),
        ValueType::I16 => fixed!(I16, i16),
        ValueType::U32 => fixed!(U32, u32),
        ValueType::I32 => fixed!(I32, i32),
        ValueType::F32 => fixed!(F32, f32),
        ValueType::U64 => fixed!(U64, u64),
        ValueType::I64 => fixed!(I64, i64),
        ValueType::F64 => fixed!(F64, f64),
        ValueType::Bool => {
            let raw = c.take(n, &|| format!("array '{key}'"))?;
            let mut v = Vec::with_capacity(n);
            for (i, &b) in raw.iter().enumerate() {
                match b {
                    0 => v.push(false),
                    1 => v.push(true),
                    _ => {
                        return Err(GgufError::Format(format!(
                            "array '{key}' element {i} is a bool with byte value {b}"
                        )));
                    }
                }
            }
            Array::Bool(v)
        }
        ValueType::String => {
            if n > c.strings_left {
                return Err(GgufError::Format(format!(
                    "array '{key}' holds {n} strings: more than the {MAX_ARRAY_STRINGS} the file's string arrays may hold in all"
                )));
            }
            c.strings_left -= n;
            // A String (24 bytes) is larger than its smallest encoding (8): reserve a bounded
            // part and grow as elements parse.
            let mut v = Vec::with_capacity(n.min(RESERVE_ENTRIES * 64));
            for i in 0..n {
                v.push(c.string(&|| format!("element {i} of array '{key}'"))?);
            }
            Array::String(v)
        }
        ValueType::Array => unreachable!("rejected above"),
    };
    Ok(Value::Array(arr))
}

fn parse_header(buf: &[u8]) -> Result<Header> {
    let mut c = Cursor {
        buf,
        pos: 0,
        strings_left: MAX_ARRAY_STRINGS,
    };
    let magic = c.u32(&|| "the magic number".into())?;
    if magic != GGUF_MAGIC {
        let shown: String = buf
            .iter()
            .take(4)
            .map(|&b| if b.is_ascii_graphic() { b as char } else { '.' })
            .collect();
        return Err(GgufError::Format(format!(
            "not a GGUF file: magic is {shown:?} (0x{magic:08x}), expected \"GGUF\""
        )));
    }
    let version = c.u32(&|| "the version".into())?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(GgufError::Format(
                "GGUF version 1 is not supported (only versions 2 and 3)".into(),
            ));
        }
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(GgufError::Format(format!(
                "GGUF version {v} looks like a big-endian file (version {}), which is not supported",
                v.swap_bytes()
            )));
        }
        v => {
            return Err(GgufError::Format(format!(
                "unsupported GGUF version {v} (supported: 2, 3)"
            )));
        }
    }
    let n_tensors = c.u64(&|| "the tensor count".into())?;
    let n_kv = c.u64(&|| "the metadata count".into())?;
    // Smallest possible entries: a key is 8 + 1 bytes plus a 4-byte type plus a 1-byte value;
    // a tensor info is 8 + 0 (name) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset).
    if n_kv > MAX_ENTRIES {
        return Err(GgufError::Format(format!(
            "header claims {n_kv} metadata entries; at most {MAX_ENTRIES} are accepted"
        )));
    }
    if n_kv > (c.remaining() / 14) as u64 {
        return Err(GgufError::Format(format!(
            "header claims {n_kv} metadata entries, more than the {} remaining bytes can hold",
            c.remaining()
        )));
    }

    // Reserved for at most a few thousand entries: the count is only bounded by the file's
    // size, and an entry in memory is larger than its smallest encoding (the rest grows as
    // entries actually parse).
    let reserve = (n_kv as usize).min(RESERVE_ENTRIES);
    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(reserve);
    let mut seen: HashMap<String, ()> = HashMap::with_capacity(reserve);
    for i in 0..n_kv {
        let key = c.string(&|| format!("the key of metadata entry {i}"))?;
        if key.is_empty() {
            return Err(GgufError::Format(format!(
                "metadata entry {i} has an empty key"
            )));
        }
        let ty_id = c.u32(&|| format!("the type of key '{key}'"))?;
        let ty = ValueType::from_id(ty_id).ok_or_else(|| {
            GgufError::Format(format!("key '{key}' has unknown value type {ty_id}"))
        })?;
        let value = read_value(&mut c, ty, &key)?;
        if seen.insert(key.clone(), ()).is_some() {
            return Err(GgufError::Format(format!("duplicate metadata key '{key}'")));
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) => {
            let a = *a as u64;
            if a == 0 || !a.is_power_of_two() {
                return Err(GgufError::Format(format!(
                    "general.alignment is {a}, not a power of two"
                )));
            }
            a
        }
        Some((_, v)) => {
            return Err(GgufError::Format(format!(
                "general.alignment has type {}, expected u32",
                v.value_type().name()
            )));
        }
    };

    if n_tensors > MAX_ENTRIES {
        return Err(GgufError::Format(format!(
            "header claims {n_tensors} tensors; at most {MAX_ENTRIES} are accepted"
        )));
    }
    if n_tensors > (c.remaining() / 32) as u64 {
        return Err(GgufError::Format(format!(
            "header claims {n_tensors} tensors, more than the {} remaining bytes can describe",
            c.remaining()
        )));
    }
    let reserve = (n_tensors as usize).min(RESERVE_ENTRIES);
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(reserve);
    let mut names: HashMap<String, ()> = HashMap::with_capacity(reserve);
    for i in 0..n_tensors {
        let name = c.string(&|| format!("the name of tensor {i}"))?;
        if name.len() > MAX_TENSOR_NAME {
            return Err(GgufError::Format(format!(
                "tensor {i} has a name of {} bytes; ggml allows at most {MAX_TENSOR_NAME}",
                name.len()
            )));
        }
        let n_dims = c.u32(&|| format!("the dimension count of tensor '{name}'"))? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(GgufError::Format(format!(
                "tensor '{name}' has {n_dims} dimensions; expected 1 to {MAX_DIMS}"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims);
        for d in 0..n_dims {
            let ne = c.u64(&|| format!("dimension {d} of tensor '{name}'"))?;
            if ne > i64::MAX as u64 {
                return Err(GgufError::Format(format!(
                    "tensor '{name}' dimension {d} is negative ({})",
                    ne as i64
                )));
            }
            dims.push(ne);
        }
        let type_id = c.u32(&|| format!("the type of tensor '{name}'"))?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
            GgufError::Format(format!(
                "tensor '{name}' has unknown ggml type id {type_id}"
            ))
        })?;
        let offset = c.u64(&|| format!("the data offset of tensor '{name}'"))?;

        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| {
                GgufError::Format(format!(
                    "tensor '{name}' shape {dims:?} overflows the element count"
                ))
            })?;
        let row_bytes = ggml_type.row_bytes(dims[0]).ok_or_else(|| {
            GgufError::Format(format!(
                "tensor '{name}' has {} elements per row, not a multiple of the {} block size {}",
                dims[0],
                ggml_type.name(),
                ggml_type.block_size()
            ))
        })?;
        let n_rows = n_elements.checked_div(dims[0]).unwrap_or(0);
        let n_bytes = row_bytes
            .checked_mul(n_rows)
            .ok_or_else(|| GgufError::Format(format!("tensor '{name}' byte size overflows")))?;
        if names.insert(name.clone(), ()).is_some() {
            return Err(GgufError::Format(format!("duplicate tensor name '{name}'")));
        }
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            n_bytes,
            shard: 0,
        });
    }

    // The data section starts at the next multiple of the alignment.
    let header_end = c.pos as u64;
    let data_offset = if tensors.is_empty() {
        header_end
    } else {
        header_end.div_ceil(alignment) * alignment
    };
    let file_len = buf.len() as u64;
    if !tensors.is_empty() && data_offset > file_len {
        return Err(GgufError::Format(format!(
            "truncated file: data section would start at byte {data_offset}, file has {file_len} bytes"
        )));
    }
    let data_len = file_len.saturating_sub(data_offset);
    let mut expected = 0u64;
    for t in &tensors {
        if t.offset != expected {
            return Err(GgufError::Format(format!(
                "tensor '{}' has data offset {}, expected {expected} (tensors must be laid out in order, each aligned to {alignment})",
                t.name, t.offset
            )));
        }
        let end = t.offset.checked_add(t.n_bytes).filter(|&e| e <= data_len).ok_or_else(|| {
            GgufError::Format(format!(
                "truncated file: tensor '{}' needs bytes {}..{} of the data section, which has {data_len} bytes",
                t.name,
                t.offset,
                t.offset as u128 + t.n_bytes as u128
            ))
        })?;
        expected = end
            .div_ceil(alignment)
            .checked_mul(alignment)
            .ok_or_else(|| {
                GgufError::Format(format!("tensor '{}' padded size overflows", t.name))
            })?;
    }

    Ok(Header {
        version,
        alignment,
        data_offset,
        metadata,
        tensors,
    })
}
