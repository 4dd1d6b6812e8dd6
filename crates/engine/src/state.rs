//! Saved sequence state ("session files", llama.cpp's `llama_state_seq_save_file`): the tokens a
//! sequence's KV cache holds and the rows it needs to continue from them, in a file that a later
//! run (another process, another backend) loads instead of running the prompt again.
//!
//! What is saved is what the next token reads: on every NoPE layer the plane's rows `0..len`, on
//! every sliding layer the ring's contiguous run of positions ending at `len - 1` (at least the
//! window; more where the ring still holds them, so a loaded cache can go back as far as the
//! saved one could). Rows are stored in the cache type, byte for byte as the cache holds them
//! (the CPU and CUDA caches share the row layout: `n_head_kv * head_dim` values, q8_0 in ggml's
//! 34-byte blocks), so a load reproduces the saved cache exactly.
//!
//! Fail closed: a file is loaded only into the model it was saved from (`MuseGlimmer::fingerprint`:
//! the tensors' names, shapes, types and sampled bytes, and the model's hyperparameters), into a
//! cache of its type and of a context that holds its positions; any other file, a truncated or
//! altered one included (a checksum covers every byte), is refused with the reason.
//!
//! Layout (little-endian): `MUSERKV1`, u32 version, u64 model fingerprint, u32 cache type (ggml
//! type id), u32 layers, u32 sliding window, u64 row bytes, u64 positions, u32 length of a
//! "made by" note and its UTF-8 bytes, the tokens (u32 each), then per layer u8 kind (0 ring,
//! 1 plane), u64 first position held, its K rows then its V rows; last, u64 checksum of all
//! the bytes before it.

use std::io::Write;
use std::path::Path;

use crate::config::MuseConfig;
use crate::error::{Error, Result};
use crate::kv::KvType;

const MAGIC: &[u8; 8] = b"MUSERKV1";
const VERSION: u32 = 1;

/// One layer's saved rows: positions `lo..len` of the image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerImage {
    pub sliding: bool,
    /// The first position held (0 on a plane).
    pub lo: usize,
    pub k: Vec<u8>,
    pub v: Vec<u8>,
}

/// A sequence's KV cache on the host, backend-neutral (`Backend::kv_export` / `kv_import`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvImage {
    pub ty: KvType,
    /// Bytes of one row (all KV heads of one token).
    pub row_bytes: usize,
    /// Positions stored: the next token is at `len`.
    pub len: usize,
    pub layers: Vec<LayerImage>,
}

impl KvImage {
    /// Whether this image can become a cache of type `ty`, `row_bytes` per row, `n_ctx`
    /// positions and layers of kinds `sliding` (true: a ring of a window of `n_swa`): the same
    /// layers, every layer's rows all there, and every sliding layer holding the window the next
    /// token reads (positions `len + 1 - n_swa .. len`).
    pub fn check(
        &self,
        ty: KvType,
        row_bytes: usize,
        n_ctx: usize,
        n_swa: usize,
        sliding: &[bool],
    ) -> Result<()> {
        let bad = |m: String| Err(Error::Input(format!("saved state: {m}")));
        if self.ty != ty {
            return bad(format!(
                "its cache type is {}, the cache it would load into is {} (give --kv-type {})",
                self.ty.name(),
                ty.name(),
                self.ty.name()
            ));
        }
        if self.row_bytes != row_bytes {
            return bad(format!(
                "rows of {} bytes, this model's are {row_bytes}",
                self.row_bytes
            ));
        }
        if self.len > n_ctx {
            return bad(format!(
                "it holds {} positions, more than the context size {n_ctx}",
                self.len
            ));
        }
        if self.layers.len() != sliding.len() {
            return bad(format!(
                "{} layers, this model has {}",
                self.layers.len(),
                sliding.len()
            ));
        }
        let window_lo = (self.len + 1).saturating_sub(n_swa).min(self.len);
        for (i, (l, &kind)) in self.layers.iter().zip(sliding).enumerate() {
            if l.sliding != kind {
                return bad(format!("layer {i} is of another kind than this model's"));
            }
            let want_lo = if l.sliding { window_lo } else { 0 };
            if l.lo > want_lo {
                return bad(format!(
                    "layer {i} holds positions from {}, the next token reads from {want_lo}",
                    l.lo
                ));
            }
            let n = (self.len - l.lo)
                .checked_mul(row_bytes)
                .ok_or_else(|| Error::Input("saved state: sizes overflow".into()))?;
            if l.k.len() != n || l.v.len() != n {
                return bad(format!(
                    "layer {i} has rows of another size than its positions"
                ));
            }
        }
        Ok(())
    }

    /// For a ring of `slots` slots (slot = position % slots) loading sliding layer rows `lo..len`:
    /// the positions it can hold (the last `slots` of them), and the cache's `high` afterwards,
    /// the bound `kv::ring_allows_truncate` reads: every position `q < len` with
    /// `q + slots >= high` is then in its slot (positions before the first loaded count as
    /// overwritten).
    pub fn ring_range(&self, lo: usize, slots: usize) -> (usize, usize, usize) {
        let first = lo.max(self.len.saturating_sub(slots));
        let high = self.len.max(first + slots);
        (first, self.len, high)
    }
}

/// What a state file holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedState {
    /// The model it was saved from (`MuseGlimmer::fingerprint`).
    pub fingerprint: u64,
    /// Who computed the rows (backend and mode), shown when it is loaded.
    pub made_by: String,
    /// The tokens at positions `0..image.len`.
    pub tokens: Vec<u32>,
    pub image: KvImage,
}

/// A 64-bit FNV-1a over 8-byte little-endian words (a trailing partial word zero-padded, the
/// length mixed in last): a checksum against truncation and corruption, not a cryptographic
/// hash, fast enough for caches of gigabytes.
#[derive(Clone, Copy)]
pub struct Hasher {
    h: u64,
    n: u64,
    tail: [u8; 8],
    t: usize,
}

impl Default for Hasher {
    fn default() -> Self {
        Self::new()
    }
}

impl Hasher {
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    pub fn new() -> Self {
        Hasher {
            h: 0xcbf2_9ce4_8422_2325,
            n: 0,
            tail: [0; 8],
            t: 0,
        }
    }

    fn word(&mut self, w: u64) {
        self.h = (self.h ^ w).wrapping_mul(Self::PRIME);
    }

    pub fn update(&mut self, mut b: &[u8]) {
        self.n += b.len() as u64;
        if self.t > 0 {
            let take = (8 - self.t).min(b.len());
            self.tail[self.t..self.t + take].copy_from_slice(&b[..take]);
            self.t += take;
            b = &b[take..];
            if self.t < 8 {
                return;
            }
            self.word(u64::from_le_bytes(self.tail));
            self.t = 0;
        }
        let mut words = b.chunks_exact(8);
        for w in &mut words {
            let mut a = [0u8; 8];
            a.copy_from_slice(w);
            self.word(u64::from_le_bytes(a));
        }
        let rest = words.remainder();
        self.tail[..rest.len()].copy_from_slice(rest);
        self.t = rest.len();
    }

    pub fn finish(mut self) -> u64 {
        if self.t > 0 {
            self.tail[self.t..].fill(0);
            self.word(u64::from_le_bytes(self.tail));
        }
        let n = self.n;
        self.word(n);
        self.h
    }
}

/// Writes through the checksum.
struct Out<W: Write> {
    w: W,
    hash: Hasher,
    n: u64,
}

impl<W: Write> Out<W> {
    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.hash.update(b);
        self.n += b.len() as u64;
        self.w.write_all(b)
    }
}

/// The cache type as its ggml type id.
fn kv_code(ty: KvType) -> u32 {
    match ty {
        KvType::F32 => 0,
        KvType::F16 => 1,
        KvType::Q8_0 => 8,
        KvType::BF16 => 30,
    }
}

fn kv_from_code(c: u32) -> Option<KvType> {
    [KvType::F32, KvType::F16, KvType::BF16, KvType::Q8_0]
        .into_iter()
        .find(|&t| kv_code(t) == c)
}

/// Write `s` to `path` (through a temporary file beside it, renamed over it at the end, so a
/// crash never leaves half a file under the name, and two saves to one name at once leave one
/// of them whole). Returns the bytes written.
pub fn save(path: &Path, s: &SavedState, n_swa: usize) -> Result<u64> {
    if s.tokens.len() != s.image.len {
        return Err(Error::Input(format!(
            "saving state: {} tokens for a cache of {} positions",
            s.tokens.len(),
            s.image.len
        )));
    }
    let io = |e: std::io::Error| Error::Io(format!("saving state to {}: {e}", path.display()));
    // A temporary name of this process and this call: saves to one name at once (two server
    // requests) each write their own file, and the last rename wins whole.
    static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.{call}.tmp", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let f = std::fs::File::create(&tmp).map_err(io)?;
    let mut o = Out {
        w: std::io::BufWriter::with_capacity(1 << 20, f),
        hash: Hasher::new(),
        n: 0,
    };
    let written = (|| -> std::io::Result<u64> {
        let im = &s.image;
        o.put(MAGIC)?;
        o.put(&VERSION.to_le_bytes())?;
        o.put(&s.fingerprint.to_le_bytes())?;
        o.put(&kv_code(im.ty).to_le_bytes())?;
        o.put(&(im.layers.len() as u32).to_le_bytes())?;
        o.put(&(n_swa as u32).to_le_bytes())?;
        o.put(&(im.row_bytes as u64).to_le_bytes())?;
        o.put(&(im.len as u64).to_le_bytes())?;
        o.put(&(s.made_by.len() as u32).to_le_bytes())?;
        o.put(s.made_by.as_bytes())?;
        let toks: Vec<u8> = s.tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        o.put(&toks)?;
        for l in &im.layers {
            o.put(&[if l.sliding { 0 } else { 1 }])?;
            o.put(&(l.lo as u64).to_le_bytes())?;
            o.put(&l.k)?;
            o.put(&l.v)?;
        }
        let sum = o.hash.finish();
        let n = o.n + 8;
        o.w.write_all(&sum.to_le_bytes())?;
        let f = o.w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        Ok(n)
    })()
    .map_err(io);
    let n = match written {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(n)
}

/// Read a state file, checking its structure and checksum (not yet the model: `Session::load_state`
/// and `KvImage::check` do that). A file of any content gives an error, never a panic, and no
/// allocation larger than the file.
pub fn load(path: &Path) -> Result<SavedState> {
    let f = std::fs::File::open(path)
        .map_err(|e| Error::Io(format!("loading state from {}: {e}", path.display())))?;
    // SAFETY: the map is read-only and private; a file changed under it while it is read can
    // give wrong bytes (caught by the checksum) but not unsoundness in this process's memory.
    let map = unsafe { memmap2::Mmap::map(&f) }
        .map_err(|e| Error::Io(format!("loading state from {}: {e}", path.display())))?;
    parse(&map).map_err(|m| {
        Error::Input(format!(
            "{}: not a usable Muser state file: {m}",
            path.display()
        ))
    })
}

/// Parse a state file's bytes.
pub fn parse(b: &[u8]) -> std::result::Result<SavedState, String> {
    if b.len() < MAGIC.len() + 8 || &b[..8] != MAGIC {
        return Err("it does not begin with MUSERKV1".into());
    }
    let body = &b[..b.len() - 8];
    let mut sum = [0u8; 8];
    sum.copy_from_slice(&b[b.len() - 8..]);
    let mut h = Hasher::new();
    h.update(body);
    if h.finish() != u64::from_le_bytes(sum) {
        return Err("its checksum does not match (a truncated or damaged file)".into());
    }
    let mut c = Cursor { b: body, at: 8 };
    let version = c.u32()?;
    if version != VERSION {
        return Err(format!(
            "version {version}, this build reads version {VERSION}"
        ));
    }
    let fingerprint = c.u64()?;
    let code = c.u32()?;
    let ty = kv_from_code(code).ok_or(format!("unknown cache type {code}"))?;
    let n_layer = c.u32()? as usize;
    let _n_swa = c.u32()?;
    let row_bytes = c.usize()?;
    let len = c.usize()?;
    let note_len = c.u32()? as usize;
    let made_by = String::from_utf8(c.take(note_len)?.to_vec())
        .map_err(|_| "its note is not UTF-8".to_string())?;
    let tok_bytes = c.take(len.checked_mul(4).ok_or("sizes overflow")?)?;
    let tokens = tok_bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    if n_layer > c.left() {
        return Err(format!("{n_layer} layers in a file of {} bytes", b.len()));
    }
    let mut layers = Vec::with_capacity(n_layer);
    for i in 0..n_layer {
        let kind = c.take(1)?[0];
        let sliding = match kind {
            0 => true,
            1 => false,
            k => return Err(format!("layer {i}: unknown kind {k}")),
        };
        let lo = c.usize()?;
        if lo > len {
            return Err(format!(
                "layer {i} begins at {lo}, past its {len} positions"
            ));
        }
        let n = (len - lo).checked_mul(row_bytes).ok_or("sizes overflow")?;
        let k = c.take(n)?.to_vec();
        let v = c.take(n)?.to_vec();
        layers.push(LayerImage { sliding, lo, k, v });
    }
    if c.left() != 0 {
        return Err(format!("{} bytes after its last layer", c.left()));
    }
    Ok(SavedState {
        fingerprint,
        made_by,
        tokens,
        image: KvImage {
            ty,
            row_bytes,
            len,
            layers,
        },
    })
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> usize {
        self.b.len() - self.at
    }
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        if n > self.left() {
            return Err(format!(
                "it ends early ({n} bytes wanted at offset {}, {} left)",
                self.at,
                self.left()
            ));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> std::result::Result<u64, String> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn usize(&mut self) -> std::result::Result<usize, String> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| format!("a size of {v} does not fit this machine"))
    }
}

/// The model's identity for state files: its hyperparameters, every tensor's name, shape, type
/// and size, and 4 KiB from the start, middle and end of each tensor's bytes (a few megabytes
/// read for a 30B model: two checkpoints of one architecture differ there).
pub fn fingerprint(g: &muser_gguf::Gguf, cfg: &MuseConfig) -> u64 {
    let mut h = Hasher::new();
    h.update(format!("{cfg:?}").as_bytes());
    for t in g.tensors() {
        h.update(t.name.as_bytes());
        for d in &t.dims {
            h.update(&d.to_le_bytes());
        }
        h.update(format!("{:?}", t.ggml_type).as_bytes());
        h.update(&t.n_bytes.to_le_bytes());
        let data = g.tensor_data(t);
        const SAMPLE: usize = 4096;
        if data.len() <= 3 * SAMPLE {
            h.update(data);
        } else {
            let mid = data.len() / 2;
            h.update(&data[..SAMPLE]);
            h.update(&data[mid..mid + SAMPLE]);
            h.update(&data[data.len() - SAMPLE..]);
        }
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hasher_streams_like_one_update() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut one = Hasher::new();
        one.update(&data);
        let one = one.finish();
        for split in [1, 3, 7, 8, 9, 500, 999] {
            let mut h = Hasher::new();
            h.update(&data[..split]);
            h.update(&data[split..]);
            assert_eq!(h.finish(), one, "split at {split}");
        }
        // Zero padding does not make a shorter input collide with a longer one.
        let mut a = Hasher::new();
        a.update(&[1, 2, 3]);
        let mut b = Hasher::new();
        b.update(&[1, 2, 3, 0]);
        assert_ne!(a.finish(), b.finish());
    }

    fn image() -> SavedState {
        SavedState {
            fingerprint: 42,
            made_by: "test".into(),
            tokens: vec![1, 2, 3],
            image: KvImage {
                ty: KvType::F16,
                row_bytes: 4,
                len: 3,
                layers: vec![
                    LayerImage {
                        sliding: true,
                        lo: 1,
                        k: vec![1; 8],
                        v: vec![2; 8],
                    },
                    LayerImage {
                        sliding: false,
                        lo: 0,
                        k: vec![3; 12],
                        v: vec![4; 12],
                    },
                ],
            },
        }
    }

    #[test]
    fn a_file_reads_back_and_every_damage_is_refused() {
        let dir = std::env::temp_dir().join(format!("muser-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("s.bin");
        let s = image();
        let n = save(&p, &s, 2).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(n, bytes.len() as u64);
        assert_eq!(load(&p).unwrap(), s);
        // Every truncation and every single flipped byte is refused, none panics.
        for cut in 0..bytes.len() {
            assert!(parse(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(parse(&b).is_err(), "byte {i} flipped");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ring_range_claims_only_what_it_loads() {
        let mut s = image().image;
        s.len = 100;
        // A ring of 16 slots loading rows from 50: the last 16 positions, high = len.
        assert_eq!(s.ring_range(50, 16), (84, 100, 100));
        // A ring larger than the rows: all of them, and high as if the ring had wrapped past
        // the positions before them.
        assert_eq!(s.ring_range(90, 16), (90, 100, 106));
        for (lo, slots) in [(0, 16), (50, 16), (90, 16), (99, 4), (0, 200)] {
            let (first, len, high) = s.ring_range(lo, slots);
            for q in 0..len {
                if q + slots >= high {
                    assert!(
                        q >= first,
                        "q {q} claimed held but not loaded (lo {lo}, slots {slots})"
                    );
                }
            }
        }
    }
}
