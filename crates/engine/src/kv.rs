//! The KV cache, shaped like the model: a ring of `n_swa + RING_SLACK` slots per sliding layer
//! and a plane growing up to the context length per full (NoPE) layer.
//!
//! Sliding-layer K rows carry their RoPE rotation, so a ring slot is tied to its position
//! (`slot = pos % slots`, with the position recorded). NoPE-layer rows carry no position:
//! the plane is a plain array indexed by position, whose tiles can move by plain copy.
//! Rows are stored in the cache type (f32, f16, bf16, q8_0), so a stored row is rounded
//! exactly once, when it is written.

use half::{bf16, f16};
use muser_gguf::GgmlType;

use crate::config::{LayerKind, MuseConfig};
use crate::error::{Error, Result};
use crate::formats;
use crate::state::{KvImage, LayerImage};

/// Ring slots the CPU cache keeps beyond the window on each sliding layer: a cache can go back
/// this many positions and one more (prefix reuse: a conversation's next prompt re-renders the
/// last answer, whose tokens then differ from the ones generated). The CUDA cache's rings have
/// a micro-batch (512) of slack for the same reason and for its prompt kernels.
pub const RING_SLACK: usize = 512;

/// Whether a cache holding positions `..stored`, whose sliding layers keep positions in rings of
/// `ring_slots` (slot = position % ring_slots) and have been written up to position `high - 1`
/// at most since the cache was cleared (`high >= stored`: more after an earlier going back),
/// may go back to its first `len` positions. A token at `len` attends to keys
/// `len + 1 - n_swa ..= len` on sliding layers (key j visible iff `0 <= p - j < n_swa`), so the
/// rings must still hold `len + 1 - n_swa .. len`: a position q is in its slot while no later
/// position of the same slot has been written, certainly when `q + ring_slots >= high`. Slots
/// holding positions past `len` are never read as visible keys then: each is written again
/// before a token reaches it.
pub fn ring_allows_truncate(
    len: usize,
    stored: usize,
    high: usize,
    ring_slots: usize,
    n_swa: usize,
) -> bool {
    if len > stored {
        return false;
    }
    len == 0 || (len + 1).saturating_sub(n_swa) + ring_slots >= high.max(stored)
}

/// Element type of the KV cache (llama.cpp's `--cache-type-k/v`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvType {
    F32,
    #[default]
    F16,
    BF16,
    Q8_0,
}

impl KvType {
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" => Self::F32,
            "f16" => Self::F16,
            "bf16" => Self::BF16,
            "q8_0" => Self::Q8_0,
            _ => {
                return Err(Error::Input(format!(
                    "unknown KV cache type '{s}' (expected f32, f16, bf16 or q8_0)"
                )));
            }
        })
    }

    pub fn ggml_type(self) -> GgmlType {
        match self {
            Self::F32 => GgmlType::F32,
            Self::F16 => GgmlType::F16,
            Self::BF16 => GgmlType::BF16,
            Self::Q8_0 => GgmlType::Q8_0,
        }
    }

    pub fn name(self) -> &'static str {
        self.ggml_type().name()
    }

    /// Bytes of one stored row of `n` values.
    pub fn row_bytes(self, n: usize) -> Result<usize> {
        self.ggml_type()
            .row_bytes(n as u64)
            .map(|b| b as usize)
            .ok_or_else(|| {
                Error::Config(format!(
                    "a KV row of {n} values cannot be stored as {}",
                    self.name()
                ))
            })
    }

    /// Store one f32 row in this type (`dst` has `row_bytes(src.len())` bytes). f16 and bf16
    /// round to nearest even; q8_0 uses ggml's reference quantizer (`quantize_row_q8_0_ref`:
    /// `d = amax / 127`, `q = roundf(x / d)`).
    pub fn store_row(self, src: &[f32], dst: &mut [u8]) {
        match self {
            Self::F32 => {
                for (d, x) in dst.chunks_exact_mut(4).zip(src) {
                    d.copy_from_slice(&x.to_le_bytes());
                }
            }
            Self::F16 => {
                for (d, x) in dst.chunks_exact_mut(2).zip(src) {
                    d.copy_from_slice(&f16::from_f32(*x).to_bits().to_le_bytes());
                }
            }
            Self::BF16 => {
                for (d, x) in dst.chunks_exact_mut(2).zip(src) {
                    d.copy_from_slice(&bf16::from_f32(*x).to_bits().to_le_bytes());
                }
            }
            Self::Q8_0 => {
                for (blk, xs) in dst.chunks_exact_mut(34).zip(src.chunks_exact(32)) {
                    let amax = xs.iter().fold(0f32, |m, x| m.max(x.abs()));
                    let d = amax / 127.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    blk[0..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
                    for (q, x) in blk[2..].iter_mut().zip(xs) {
                        *q = ((x * id).round() as i8) as u8;
                    }
                }
            }
        }
    }

    /// Read one stored row back as f32.
    pub fn load_row(self, src: &[u8], dst: &mut [f32]) {
        formats::dequantize_row(self.ggml_type(), src, dst);
    }
}

/// One layer's stored K and V rows.
#[derive(Debug)]
pub enum LayerCache {
    /// A sliding layer: `n_swa + RING_SLACK` slots (at most the context), slot = pos % slots;
    /// `pos[slot]` is the position held
    /// (or `u32::MAX` when empty).
    Ring {
        k: Vec<u8>,
        v: Vec<u8>,
        pos: Vec<u32>,
    },
    /// A full (NoPE) layer: row `p` holds position `p`, for `p < len`.
    Plane { k: Vec<u8>, v: Vec<u8> },
}

/// The host-memory KV cache of one sequence.
#[derive(Debug)]
pub struct HostKv {
    pub ty: KvType,
    pub n_ctx: usize,
    pub n_swa: usize,
    /// Bytes of one stored row (all KV heads of one token).
    pub row_bytes: usize,
    /// Values in one row (n_head_kv * head_dim).
    pub row_len: usize,
    /// Positions stored so far: the next token is at position `len`.
    pub len: usize,
    /// One past the highest position written since the cache was cleared (above `len` after
    /// going back: `can_truncate`).
    pub high: usize,
    pub layers: Vec<LayerCache>,
    /// Parity mode keeps llama.cpp's own cell layout instead (cpu/parity.rs).
    pub parity: Option<crate::cpu::parity::ParityKv>,
}

impl HostKv {
    pub fn new(cfg: &MuseConfig, ty: KvType, n_ctx: usize) -> Result<Self> {
        let row_len = cfg.kv_dim();
        let row_bytes = ty.row_bytes(row_len)?;
        let layers = cfg
            .layer_kinds
            .iter()
            .map(|kind| match kind {
                LayerKind::SlidingRope => {
                    let slots = (cfg.n_swa + RING_SLACK).min(n_ctx);
                    LayerCache::Ring {
                        k: vec![0; slots * row_bytes],
                        v: vec![0; slots * row_bytes],
                        pos: vec![u32::MAX; slots],
                    }
                }
                LayerKind::FullNope => LayerCache::Plane {
                    k: Vec::new(),
                    v: Vec::new(),
                },
            })
            .collect();
        Ok(HostKv {
            ty,
            n_ctx,
            n_swa: cfg.n_swa,
            row_bytes,
            row_len,
            len: 0,
            high: 0,
            layers,
            parity: None,
        })
    }

    /// Whether the cache may go back to its first `len` positions (`ring_allows_truncate`;
    /// never in parity mode, whose cells follow llama.cpp's layout).
    pub fn can_truncate(&self, len: usize) -> bool {
        if self.parity.is_some() {
            return len == self.len;
        }
        self.layers.iter().all(|l| match l {
            LayerCache::Ring { pos, .. } => {
                ring_allows_truncate(len, self.len, self.high, pos.len(), self.n_swa)
            }
            LayerCache::Plane { .. } => len <= self.len,
        })
    }

    /// Go back to the first `len` positions (`can_truncate`): the planes drop their later rows;
    /// the rings keep theirs, tagged with their positions, until they are written again.
    pub fn truncate(&mut self, len: usize) {
        let rb = self.row_bytes;
        for l in &mut self.layers {
            if let LayerCache::Plane { k, v } = l {
                k.truncate(len * rb);
                v.truncate(len * rb);
            }
        }
        self.len = len;
    }

    /// Become a copy of `src` (a cache of the same model, context and type): every position it
    /// holds, its length. Not in parity mode (llama.cpp's cell layout is not copied).
    pub fn copy_from(&mut self, src: &HostKv) -> Result<()> {
        if self.parity.is_some() || src.parity.is_some() {
            return Err(Error::Backend(
                "parity mode's KV cache is not copied".into(),
            ));
        }
        if (
            self.ty,
            self.n_ctx,
            self.n_swa,
            self.row_bytes,
            self.layers.len(),
        ) != (
            src.ty,
            src.n_ctx,
            src.n_swa,
            src.row_bytes,
            src.layers.len(),
        ) {
            return Err(Error::Backend(
                "a KV cache copied into one of another shape".into(),
            ));
        }
        for (d, s) in self.layers.iter_mut().zip(&src.layers) {
            match (d, s) {
                (
                    LayerCache::Ring { k, v, pos },
                    LayerCache::Ring {
                        k: sk,
                        v: sv,
                        pos: sp,
                    },
                ) if k.len() == sk.len() && pos.len() == sp.len() => {
                    k.copy_from_slice(sk);
                    v.copy_from_slice(sv);
                    pos.copy_from_slice(sp);
                }
                (LayerCache::Plane { k, v }, LayerCache::Plane { k: sk, v: sv }) => {
                    k.clone_from(sk);
                    v.clone_from(sv);
                }
                _ => {
                    return Err(Error::Backend(
                        "a KV cache copied into one of other layers".into(),
                    ));
                }
            }
        }
        self.len = src.len;
        self.high = src.high;
        Ok(())
    }

    /// Forget everything (positions restart at 0).
    pub fn clear(&mut self) {
        self.len = 0;
        self.high = 0;
        if let Some(p) = self.parity.as_mut() {
            p.clear();
        }
        for l in &mut self.layers {
            match l {
                LayerCache::Ring { pos, .. } => pos.iter_mut().for_each(|p| *p = u32::MAX),
                LayerCache::Plane { k, v } => {
                    k.clear();
                    v.clear();
                }
            }
        }
    }

    /// The stored K and V rows of position `p` in `layer`, if still held.
    pub fn rows(&self, layer: usize, p: u32) -> Option<(&[u8], &[u8])> {
        let rb = self.row_bytes;
        match &self.layers[layer] {
            LayerCache::Ring { k, v, pos } => {
                let s = p as usize % pos.len();
                (pos[s] == p).then(|| (&k[s * rb..(s + 1) * rb], &v[s * rb..(s + 1) * rb]))
            }
            LayerCache::Plane { k, v } => {
                let s = p as usize;
                ((s + 1) * rb <= k.len())
                    .then(|| (&k[s * rb..(s + 1) * rb], &v[s * rb..(s + 1) * rb]))
            }
        }
    }

    /// Write the stored K and V rows of position `p` in `layer`.
    pub fn put(&mut self, layer: usize, p: u32, k_row: &[u8], v_row: &[u8]) {
        let rb = self.row_bytes;
        self.high = self.high.max(p as usize + 1);
        match &mut self.layers[layer] {
            LayerCache::Ring { k, v, pos } => {
                let s = p as usize % pos.len();
                k[s * rb..(s + 1) * rb].copy_from_slice(k_row);
                v[s * rb..(s + 1) * rb].copy_from_slice(v_row);
                pos[s] = p;
            }
            LayerCache::Plane { k, v } => {
                let s = p as usize;
                debug_assert_eq!(
                    k.len(),
                    s * rb,
                    "NoPE plane rows are appended in position order"
                );
                k.truncate(s * rb);
                v.truncate(s * rb);
                k.extend_from_slice(k_row);
                v.extend_from_slice(v_row);
            }
        }
    }

    /// The rows the next token reads, and on sliding layers every earlier position the ring
    /// still holds in one run (`state`). Not in parity mode (llama.cpp's cell layout).
    pub fn export(&self) -> Result<KvImage> {
        if self.parity.is_some() {
            return Err(Error::Backend(
                "parity mode's KV cache is not saved (it keeps llama.cpp's cell layout)".into(),
            ));
        }
        let rb = self.row_bytes;
        let len = self.len;
        let mut layers = Vec::with_capacity(self.layers.len());
        for (li, l) in self.layers.iter().enumerate() {
            layers.push(match l {
                LayerCache::Ring { .. } => {
                    let mut lo = len;
                    while lo > 0 && self.rows(li, (lo - 1) as u32).is_some() {
                        lo -= 1;
                    }
                    let mut k = Vec::with_capacity((len - lo) * rb);
                    let mut v = Vec::with_capacity((len - lo) * rb);
                    for p in lo..len {
                        if let Some((kr, vr)) = self.rows(li, p as u32) {
                            k.extend_from_slice(kr);
                            v.extend_from_slice(vr);
                        }
                    }
                    LayerImage {
                        sliding: true,
                        lo,
                        k,
                        v,
                    }
                }
                LayerCache::Plane { k, v } => LayerImage {
                    sliding: false,
                    lo: 0,
                    k: k[..len * rb].to_vec(),
                    v: v[..len * rb].to_vec(),
                },
            });
        }
        let image = KvImage {
            ty: self.ty,
            row_bytes: rb,
            len,
            layers,
        };
        image.check(self.ty, rb, self.n_ctx, self.n_swa, &self.sliding())?;
        Ok(image)
    }

    fn sliding(&self) -> Vec<bool> {
        self.layers
            .iter()
            .map(|l| matches!(l, LayerCache::Ring { .. }))
            .collect()
    }

    /// Become exactly `image`'s positions (`KvImage::check`ed first; cleared).
    pub fn import(&mut self, image: &KvImage) -> Result<()> {
        if self.parity.is_some() {
            return Err(Error::Backend(
                "parity mode's KV cache is not loaded (it keeps llama.cpp's cell layout)".into(),
            ));
        }
        image.check(
            self.ty,
            self.row_bytes,
            self.n_ctx,
            self.n_swa,
            &self.sliding(),
        )?;
        self.clear();
        let rb = self.row_bytes;
        let mut high = image.len;
        for (li, l) in image.layers.iter().enumerate() {
            let first = match &self.layers[li] {
                LayerCache::Ring { pos, .. } => {
                    let (first, _, h) = image.ring_range(l.lo, pos.len());
                    high = high.max(h);
                    first
                }
                LayerCache::Plane { .. } => l.lo,
            };
            for p in first..image.len {
                let r = (p - l.lo) * rb;
                self.put(li, p as u32, &l.k[r..r + rb], &l.v[r..r + rb]);
            }
        }
        self.len = image.len;
        self.high = high;
        Ok(())
    }

    /// Bytes held by this cache.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Ring { k, v, .. } => k.len() + v.len(),
                LayerCache::Plane { k, v } => k.len() + v.len(),
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule against a real ring: random runs forward and back (back only where
    /// `can_truncate` allows), and after each the window before the current length must be in
    /// the ring, found by its recorded positions.
    #[test]
    fn going_back_where_allowed_always_finds_the_window() {
        for (slots, w) in [(4usize, 4usize), (7, 4), (16, 4), (9, 9)] {
            let mut kv = HostKv {
                ty: KvType::F32,
                n_ctx: 1 << 20,
                n_swa: w,
                row_bytes: 4,
                row_len: 1,
                len: 0,
                high: 0,
                layers: vec![LayerCache::Ring {
                    k: vec![0; slots * 4],
                    v: vec![0; slots * 4],
                    pos: vec![u32::MAX; slots],
                }],
                parity: None,
            };
            let mut rng = 0x2545_f491_4f6c_dd1du64;
            let mut next = |n: usize| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng % n as u64) as usize
            };
            let (mut refused, mut allowed) = (0, 0);
            for _ in 0..2000 {
                if next(2) == 0 {
                    for _ in 0..1 + next(6) {
                        let p = kv.len as u32;
                        kv.put(0, p, &[1; 4], &[2; 4]);
                        kv.len += 1;
                    }
                } else {
                    let len = next(kv.len + 1);
                    if kv.can_truncate(len) {
                        kv.truncate(len);
                        allowed += 1;
                    } else {
                        refused += 1;
                    }
                }
                let lo = (kv.len + 1).saturating_sub(w);
                for q in lo..kv.len {
                    assert!(
                        kv.rows(0, q as u32).is_some(),
                        "{slots} slots, window {w}: position {q} missing at length {}",
                        kv.len
                    );
                }
            }
            assert!(
                allowed > 0 && refused > 0,
                "{slots}/{w}: {allowed} allowed, {refused} refused"
            );
        }
    }

    #[test]
    fn going_back_keeps_the_window_a_ring_still_holds() {
        // A ring of 4 slots, window 4: after 10 positions it holds 6..=9; a token at 9 needs
        // 6..=8 (held), at 8 needs 5..=7 (5 is gone).
        assert!(ring_allows_truncate(10, 10, 10, 4, 4));
        assert!(ring_allows_truncate(9, 10, 10, 4, 4));
        assert!(!ring_allows_truncate(8, 10, 10, 4, 4));
        assert!(ring_allows_truncate(0, 10, 10, 4, 4));
        assert!(!ring_allows_truncate(11, 10, 10, 4, 4));
        // Not wrapped yet: anything back to 0.
        assert!(ring_allows_truncate(1, 4, 4, 4, 4));
        // Spare slots: 16 slots after 20 positions hold 4..=19; a token at 7 needs 4..=6, at 6
        // needs 3..=5.
        assert!(ring_allows_truncate(7, 20, 20, 16, 4));
        assert!(!ring_allows_truncate(6, 20, 20, 16, 4));
        // After going back from 21 to 15: position 4's slot holds 20 now, so 7 needs more.
        assert!(!ring_allows_truncate(7, 15, 21, 16, 4));
        assert!(ring_allows_truncate(8, 15, 21, 16, 4));
    }

    #[test]
    fn q8_0_store_rounds_like_ggml_reference() {
        let mut x = [0f32; 32];
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i as f32 - 15.5) * 0.1;
        }
        let mut b = [0u8; 34];
        KvType::Q8_0.store_row(&x, &mut b);
        let mut y = [0f32; 32];
        KvType::Q8_0.load_row(&b, &mut y);
        let d = f16::from_f32(1.55 / 127.0).to_f32();
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= d * 0.5 + 1e-6, "{a} vs {b}");
        }
        // amax maps to +-127
        assert_eq!(b[2] as i8, -127);
        assert_eq!(b[33] as i8, 127);
    }
}
