//! GGUF v3 writer: metadata and tensors in insertion order, data aligned as gguf.cpp writes it.
//! Tensor bytes are either held by the writer or produced on demand while writing, so a
//! multi-gigabyte synthetic model streams to disk without being held in memory.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use crate::reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS, MAX_TENSOR_NAME};
use crate::types::GgmlType;
use crate::value::{Array, Value};
use crate::{GgufError, Result};

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    n_bytes: u64,
    data: Option<Vec<u8>>,
}

/// Builds a GGUF file.
pub struct GgufWriter {
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Set `general.alignment` (a power of two).
    pub fn set_alignment(&mut self, alignment: u32) -> Result<()> {
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(GgufError::Format(format!(
                "alignment {alignment} is not a power of two"
            )));
        }
        self.alignment = alignment as u64;
        self.add("general.alignment", Value::U32(alignment))
    }

    /// Add or replace a metadata entry.
    pub fn add(&mut self, key: &str, value: Value) -> Result<()> {
        if key.is_empty() {
            return Err(GgufError::Format("empty metadata key".into()));
        }
        if let Some(slot) = self.metadata.iter_mut().find(|(k, _)| k == key) {
            slot.1 = value;
        } else {
            self.metadata.push((key.to_string(), value));
        }
        Ok(())
    }

    pub fn add_str(&mut self, key: &str, s: &str) -> Result<()> {
        self.add(key, Value::String(s.to_string()))
    }

    pub fn add_u32(&mut self, key: &str, x: u32) -> Result<()> {
        self.add(key, Value::U32(x))
    }

    pub fn add_f32(&mut self, key: &str, x: f32) -> Result<()> {
        self.add(key, Value::F32(x))
    }

    pub fn add_array(&mut self, key: &str, a: Array) -> Result<()> {
        self.add(key, Value::Array(a))
    }

    /// Remove a metadata entry (used to build malformed fixtures in tests).
    pub fn remove(&mut self, key: &str) {
        self.metadata.retain(|(k, _)| k != key);
    }

    fn check_tensor(&self, name: &str, dims: &[u64], ty: GgmlType) -> Result<u64> {
        if name.len() > MAX_TENSOR_NAME {
            return Err(GgufError::Format(format!(
                "tensor name '{name}' is longer than {MAX_TENSOR_NAME} bytes"
            )));
        }
        if dims.is_empty() || dims.len() > MAX_DIMS {
            return Err(GgufError::Format(format!(
                "tensor '{name}' has {} dimensions",
                dims.len()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::Format(format!("duplicate tensor '{name}'")));
        }
        let n: u64 = dims.iter().product();
        let row = ty.row_bytes(dims[0]).ok_or_else(|| {
            GgufError::Format(format!(
                "tensor '{name}': row of {} is not a multiple of {} block size",
                dims[0],
                ty.name()
            ))
        })?;
        Ok(row * n.checked_div(dims[0]).unwrap_or(0))
    }

    /// Add a tensor whose bytes the writer holds. `dims` are in ggml order (row length first).
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<()> {
        let n_bytes = self.check_tensor(name, dims, ty)?;
        if data.len() as u64 != n_bytes {
            return Err(GgufError::Format(format!(
                "tensor '{name}' of shape {dims:?} and type {ty} needs {n_bytes} bytes, got {}",
                data.len()
            )));
        }
        self.tensors.push(PendingTensor {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
            n_bytes,
            data: Some(data),
        });
        Ok(())
    }

    /// Add an f32 tensor from values.
    pub fn add_f32_tensor(&mut self, name: &str, dims: &[u64], values: &[f32]) -> Result<()> {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, dims, GgmlType::F32, bytes)
    }

    /// Add a tensor whose bytes are produced by the `fill` callback of [`GgufWriter::write_with`].
    pub fn add_tensor_deferred(&mut self, name: &str, dims: &[u64], ty: GgmlType) -> Result<()> {
        let n_bytes = self.check_tensor(name, dims, ty)?;
        self.tensors.push(PendingTensor {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
            n_bytes,
            data: None,
        });
        Ok(())
    }

    /// Write to `path`; every tensor must hold its bytes.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        self.write_with(path, |name, _, _| {
            Err(io::Error::other(format!(
                "tensor '{name}' was added deferred but no data source was given"
            )))
        })
    }

    /// Write to `path`, asking `fill(name, n_bytes, out)` for the bytes of deferred tensors.
    /// `fill` must write exactly `n_bytes` bytes.
    pub fn write_with(
        &self,
        path: impl AsRef<Path>,
        fill: impl FnMut(&str, u64, &mut dyn Write) -> io::Result<()>,
    ) -> Result<()> {
        let path = path.as_ref();
        let file = File::create(path)
            .map_err(|e| GgufError::Io(format!("cannot create {}: {e}", path.display())))?;
        let mut out = BufWriter::with_capacity(8 << 20, file);
        self.write_to(&mut out, fill)
            .map_err(|e| GgufError::Io(format!("writing {}: {e}", path.display())))?;
        out.flush()
            .map_err(|e| GgufError::Io(format!("writing {}: {e}", path.display())))
    }

    /// Serialize into memory (tests and small fixtures).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.write_to(&mut v, |name, _, _| {
            Err(io::Error::other(format!("tensor '{name}' has no data")))
        })
        .map_err(|e| GgufError::Io(e.to_string()))?;
        Ok(v)
    }

    fn write_to(
        &self,
        out: &mut dyn Write,
        mut fill: impl FnMut(&str, u64, &mut dyn Write) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut w = Counting { inner: out, n: 0 };
        w.write_all(&GGUF_MAGIC.to_le_bytes())?;
        w.write_all(&3u32.to_le_bytes())?;
        w.write_all(&(self.tensors.len() as u64).to_le_bytes())?;
        w.write_all(&(self.metadata.len() as u64).to_le_bytes())?;
        for (k, v) in &self.metadata {
            write_string(&mut w, k)?;
            w.write_all(&(v.value_type() as u32).to_le_bytes())?;
            write_value(&mut w, v)?;
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            write_string(&mut w, &t.name)?;
            w.write_all(&(t.dims.len() as u32).to_le_bytes())?;
            for d in &t.dims {
                w.write_all(&d.to_le_bytes())?;
            }
            w.write_all(&t.ty.id().to_le_bytes())?;
            w.write_all(&offset.to_le_bytes())?;
            offset = (offset + t.n_bytes).div_ceil(self.alignment) * self.alignment;
        }
        if !self.tensors.is_empty() {
            pad(&mut w, self.alignment)?;
        }
        let data_start = w.n;
        for t in &self.tensors {
            let before = w.n;
            match &t.data {
                Some(d) => w.write_all(d)?,
                None => fill(&t.name, t.n_bytes, &mut w)?,
            }
            if w.n - before != t.n_bytes {
                return Err(io::Error::other(format!(
                    "tensor '{}' wrote {} bytes, expected {}",
                    t.name,
                    w.n - before,
                    t.n_bytes
                )));
            }
            let rel = w.n - data_start;
            let padded = rel.div_ceil(self.alignment) * self.alignment;
            w.write_all(&vec![0u8; (padded - rel) as usize])?;
        }
        Ok(())
    }
}

struct Counting<'a> {
    inner: &'a mut dyn Write,
    n: u64,
}

impl Write for Counting<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn pad(w: &mut Counting<'_>, alignment: u64) -> io::Result<()> {
    let target = w.n.div_ceil(alignment) * alignment;
    w.write_all(&vec![0u8; (target - w.n) as usize])
}

fn write_string(w: &mut dyn Write, s: &str) -> io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn write_value(w: &mut dyn Write, v: &Value) -> io::Result<()> {
    match v {
        Value::U8(x) => w.write_all(&[*x]),
        Value::I8(x) => w.write_all(&x.to_le_bytes()),
        Value::U16(x) => w.write_all(&x.to_le_bytes()),
        Value::I16(x) => w.write_all(&x.to_le_bytes()),
        Value::U32(x) => w.write_all(&x.to_le_bytes()),
        Value::I32(x) => w.write_all(&x.to_le_bytes()),
        Value::F32(x) => w.write_all(&x.to_le_bytes()),
        Value::Bool(x) => w.write_all(&[*x as u8]),
        Value::String(s) => write_string(w, s),
        Value::U64(x) => w.write_all(&x.to_le_bytes()),
        Value::I64(x) => w.write_all(&x.to_le_bytes()),
        Value::F64(x) => w.write_all(&x.to_le_bytes()),
        Value::Array(a) => {
            w.write_all(&(a.elem_type() as u32).to_le_bytes())?;
            w.write_all(&(a.len() as u64).to_le_bytes())?;
            match a {
                Array::U8(v) => w.write_all(v),
                Array::I8(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
                Array::U16(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
                Array::I16(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
                Array::U32(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
                Array::I32(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
                Array::F32(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
                Array::Bool(v) => v.iter().try_for_each(|x| w.write_all(&[*x as u8])),
                Array::String(v) => v.iter().try_for_each(|s| write_string(w, s)),
                Array::U64(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
                Array::I64(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
                Array::F64(v) => v.iter().try_for_each(|x| w.write_all(&x.to_le_bytes())),
            }
        }
    }
}
