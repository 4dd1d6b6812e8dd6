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
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Dequantize one block of `ty` (its `type_size` bytes) into `out` (`block_size` values).
#[inline]
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
        other => unreachable!("dequantize_block called for unsupported type {other}; the loader refuses it"),
    }
}

/// Dequantize a whole row (`n` values, a multiple of the block size).
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
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
fn dequant_q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in out[..32].iter_mut().zip(&b[2..34]) {
        *o = (q as i8) as f32 * d;
    }
}

/// block_q4_0: d (f16), qs[16]: low nibbles are elements 0..16, high nibbles 16..32; y = d * (q - 8).
fn dequant_q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        out[j] = d * ((q & 0x0F) as i32 - 8) as f32;
        out[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// block_q4_K: d, dmin (f16), scales[12] (6-bit scale/min pairs), qs[128] (nibbles).
/// Sub-block j of 32: y = (d * sc_j) * q - (dmin * m_j).
fn dequant_q4_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for j in 0..4 {
        let (s1, m1) = scale_min_k4(2 * j, scales);
        let (s2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
        let q = &qs[32 * j..32 * j + 32];
        let o = &mut out[64 * j..64 * j + 64];
        for l in 0..32 {
            o[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            o[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// block_q5_K: d, dmin (f16), scales[12], qh[32] (fifth bits), qs[128] (nibbles).
fn dequant_q5_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for j in 0..4 {
        let (s1, m1) = scale_min_k4(2 * j, scales);
        let (s2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
        let q = &qs[32 * j..32 * j + 32];
        let o = &mut out[64 * j..64 * j + 64];
        for l in 0..32 {
            let lo = (q[l] & 0x0F) + if qh[l] & u1 != 0 { 16 } else { 0 };
            let hi = (q[l] >> 4) + if qh[l] & u2 != 0 { 16 } else { 0 };
            o[l] = d1 * lo as f32 - m1;
            o[l + 32] = d2 * hi as f32 - m2;
        }
    }
}

/// block_q6_K: ql[128] (low nibbles), qh[64] (high 2 bits), scales[16] (i8), d (f16).
/// y = (d * sc) * (q - 32).
fn dequant_q6_k(b: &[u8], out: &mut [f32]) {
    let ql_all = &b[0..128];
    let qh_all = &b[128..192];
    let sc_all = &b[192..208];
    let d = f16_at(b, 208);
    for n in 0..2 {
        let ql = &ql_all[64 * n..64 * n + 64];
        let qh = &qh_all[32 * n..32 * n + 32];
        let sc = &sc_all[8 * n..8 * n + 8];
        let o = &mut out[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            o[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            o[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            o[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            o[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
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
