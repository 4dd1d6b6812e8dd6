//! Weight formats: ggml's block layouts and their exact dequantization.
//!
//! Layouts are those of `ggml-common.h` (llama.cpp b11434). Dequantization reproduces
//! gguf-py's numpy reference (`gguf/quants.py`) bit for bit: every product is rounded to
//! f32 before the next operation, with no fused multiply-add (Rust never contracts `a * b - c`).
//! Tested against gguf-py outputs in `tests/quants.rs`.

use half::{bf16, f16};
use muser_gguf::{GgmlType, QK_K};

/// The weight formats the engine computes with. Others are refused at load.
pub const SUPPORTED: [GgmlType; 8] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

pub fn is_supported(ty: GgmlType) -> bool {
    SUPPORTED.contains(&ty)
}

/// Elements per block of a type (1 for the float types).
pub fn block_len(ty: GgmlType) -> usize {
    ty.block_size()
}

#[inline]
pub fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

#[inline]
fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// `get_scale_min_k4` of ggml-quants.c: the 6-bit scale and min of sub-block `j` (0..8)
/// packed in the 12 scale bytes of a Q4_K / Q5_K block.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantize one block of `ty` (its `type_size` bytes) into `out` (`block_size` values).
#[inline(always)]
pub fn dequantize_block(ty: GgmlType, b: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => out[0] = f32_at(b, 0),
        GgmlType::F16 => out[0] = f16_at(b, 0),
        GgmlType::BF16 => out[0] = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        GgmlType::Q8_0 => dequant_q8_0(b, out),
        GgmlType::Q4_0 => dequant_q4_0(b, out),
        GgmlType::Q4_K => dequant_q4_k(b, out),
        GgmlType::Q5_K => dequant_q5_k(b, out),
        GgmlType::Q6_K => dequant_q6_k(b, out),
        other => unreachable!(
            "dequantize_block called for unsupported type {other}; the loader refuses it"
        ),
    }
}

/// f16 values (little-endian, two bytes each; `src` at least twice `out`'s length) to f32,
/// exactly: 8 at a time by the CPU's conversion where it has F16C, else by `half` (the same
/// values; `half`'s one-value conversion asks the CPU what it has on every call, and was most
/// of the accurate mode's decode after a long context, widening the f16 cache).
pub fn f16_bytes_to_f32(src: &[u8], out: &mut [f32]) {
    assert!(
        src.len() >= 2 * out.len(),
        "f16_bytes_to_f32: {} bytes for {} values",
        src.len(),
        out.len()
    );
    if has_f16c() {
        // SAFETY: `out` is valid for out.len() writes; the CPU has avx and f16c (just checked).
        unsafe { f16c_to(src, out.as_mut_ptr(), out.len()) };
        return;
    }
    for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
    }
}

/// Whether this CPU has AVX and F16C ([`f16c_to`]), asked once.
pub fn has_f16c() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| is_x86_feature_detected!("avx") && is_x86_feature_detected!("f16c"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `n` f16 values of `src` (at least 2 n bytes) into `n` f32 at `dst` by F16C, 8 at a time:
/// exact (a NaN comes out quiet, as `half` makes it).
///
/// # Safety
/// `dst` must be valid for `n` writes of f32, and the CPU must have avx and f16c
/// ([`has_f16c`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
pub unsafe fn f16c_to(src: &[u8], dst: *mut f32, n: usize) {
    use std::arch::x86_64::*;
    assert!(
        src.len() >= 2 * n,
        "f16c_to: {} bytes for {n} values",
        src.len()
    );
    let n8 = n - n % 8;
    for c in (0..n8).step_by(8) {
        // SAFETY: bytes 2c..2c+16 of src (checked above: c + 8 <= n8 <= n) and values c..c+8 at
        // dst (the caller's n).
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(2 * c) as *const __m128i);
            _mm256_storeu_ps(dst.add(c), _mm256_cvtph_ps(h));
        }
    }
    for c in n8..n {
        let v = f16::from_bits(u16::from_le_bytes([src[2 * c], src[2 * c + 1]])).to_f32();
        // SAFETY: c < n (the caller's n).
        unsafe { dst.add(c).write(v) };
    }
}

/// Without x86: never called ([`has_f16c`] is false).
///
/// # Safety
/// Never to be called.
#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn f16c_to(_src: &[u8], _dst: *mut f32, _n: usize) {
    unreachable!("f16c_to: F16C is an x86 extension")
}

/// Dequantize a whole row (`n` values, a multiple of the block size).
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => f16_bytes_to_f32(src, out),
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        _ => {
            let (bl, bs) = ty.block_geometry();
            for (o, b) in out.chunks_exact_mut(bl).zip(src.chunks_exact(bs)) {
                dequantize_block(ty, b, o);
            }
        }
    }
}

/// block_q8_0: d (f16), qs[32] (i8). y = q * d.
#[inline(always)]
fn dequant_q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let (Some(qs), Some(o)) = (b.get(2..34), out.get_mut(..32)) else {
        return;
    };
    for (o, &q) in o.iter_mut().zip(qs) {
        *o = (q as i8) as f32 * d;
    }
}

/// block_q4_0: d (f16), qs[16]: low nibbles are elements 0..16, high nibbles 16..32; y = d * (q - 8).
#[inline(always)]
fn dequant_q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let (Some(qs), Some(o)) = (b.get(2..18), out.get_mut(..32)) else {
        return;
    };
    let (lo, hi) = o.split_at_mut(16);
    for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(qs) {
        *l = d * ((q & 0x0F) as i32 - 8) as f32;
        *h = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// One 32-value half of a 64-value group: y = d1 * q - m1 (two roundings, as numpy).
#[inline(always)]
fn affine32(q: &[u8; 32], shift: u32, d1: f32, m1: f32, out: &mut [f32; 32]) {
    for l in 0..32 {
        out[l] = d1 * ((q[l] >> shift) & 0x0F) as f32 - m1;
    }
}

/// block_q4_K: d, dmin (f16), scales[12] (6-bit scale/min pairs), qs[128] (nibbles).
/// Sub-block j of 32: y = (d * sc_j) * q - (dmin * m_j).
#[inline(always)]
fn dequant_q4_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = b[16..144].as_chunks::<32>().0;
    let outs = out[..256].as_chunks_mut::<32>().0;
    for j in 0..4 {
        let (s1, m1) = scale_min_k4(2 * j, scales);
        let (s2, m2) = scale_min_k4(2 * j + 1, scales);
        let (lo, hi) = outs[2 * j..2 * j + 2].split_at_mut(1);
        affine32(&qs[j], 0, d * s1 as f32, dmin * m1 as f32, &mut lo[0]);
        affine32(&qs[j], 4, d * s2 as f32, dmin * m2 as f32, &mut hi[0]);
    }
}

/// block_q5_K: d, dmin (f16), scales[12], qh[32] (fifth bits), qs[128] (nibbles).
#[inline(always)]
fn dequant_q5_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let Some(qh) = b[16..48].as_chunks::<32>().0.first() else {
        return;
    };
    let qs = b[48..176].as_chunks::<32>().0;
    let outs = out[..256].as_chunks_mut::<32>().0;
    for j in 0..4 {
        let (s1, m1) = scale_min_k4(2 * j, scales);
        let (s2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
        let q = &qs[j];
        let (lo, hi) = outs[2 * j..2 * j + 2].split_at_mut(1);
        for l in 0..32 {
            let a = (q[l] & 0x0F) + (((qh[l] >> (2 * j)) & 1) << 4);
            let c = (q[l] >> 4) + (((qh[l] >> (2 * j + 1)) & 1) << 4);
            lo[0][l] = d1 * a as f32 - m1;
            hi[0][l] = d2 * c as f32 - m2;
        }
    }
}

/// block_q6_K: ql[128] (low nibbles), qh[64] (high 2 bits), scales[16] (i8), d (f16).
/// y = (d * sc) * (q - 32).
#[inline(always)]
fn dequant_q6_k(b: &[u8], out: &mut [f32]) {
    let ql_all = b[0..128].as_chunks::<32>().0;
    let qh_all = b[128..192].as_chunks::<32>().0;
    let sc_all = &b[192..208];
    let d = f16_at(b, 208);
    let outs = out[..256].as_chunks_mut::<32>().0;
    for n in 0..2 {
        let (ql0, ql1, qh) = (&ql_all[2 * n], &ql_all[2 * n + 1], &qh_all[n]);
        let sc = &sc_all[8 * n..8 * n + 8];
        // Quarter k of 32 values: (nibble source, nibble shift, qh shift).
        for (k, (src, ns)) in [(ql0, 0u32), (ql1, 0), (ql0, 4), (ql1, 4)]
            .into_iter()
            .enumerate()
        {
            let o = &mut outs[4 * n + k];
            for l in 0..32 {
                let q = (((src[l] >> ns) & 0x0F) | (((qh[l] >> (2 * k)) & 3) << 4)) as i32 - 32;
                o[l] = d * (sc[l / 16 + 2 * k] as i8) as f32 * q as f32;
            }
        }
    }
}

const _: () = assert!(QK_K == 256);

/// Round f32 values to a format and back (KV cache storage and parity rounding points).
pub fn round_trip_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

pub fn round_trip_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}
