//! ggml-cpu's activation quantizers: the conversion of a matmul's f32 input (src1) to the weight's
//! `vec_dot_type`, and of K/V rows to the cache type.
//!
//! - Q8_0: `quantize_row_q8_0`, AVX2 branch (arch/x86/quants.c:302).
//! - Q8_K: `quantize_row_q8_K` -> `quantize_row_q8_K_ref` (ggml-quants.c:2769; ggml-base is built
//!   without `-march=native`, so no FMA contraction is possible there).
//! - F16 / BF16: `ggml_cpu_fp32_to_fp16` (F16C, nearest even), `ggml_cpu_fp32_to_bf16`.

use super::lanes::{f32_to_bf16, f32_to_f16};

pub const QK8_0: usize = 32;
/// Bytes of a `block_q8_0`: `d` (f16) then `qs[32]` (i8).
pub const Q8_0_BYTES: usize = 34;
pub const QK_K: usize = 256;
/// Bytes of a `block_q8_K`: `d` (f32), `qs[256]` (i8), `bsums[16]` (i16).
pub const Q8_K_BYTES: usize = 292;

/// A `block_q8_K` (ggml-common.h): the K-quants' activation block.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    /// Sums of each group of 16 `qs`.
    pub bsums: [i16; QK_K / 16],
}

impl BlockQ8K {
    pub const ZERO: BlockQ8K = BlockQ8K {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; QK_K / 16],
    };

    /// ggml's byte layout (for comparisons with ggml's own output).
    pub fn to_bytes(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_le_bytes());
        out.extend(self.qs.iter().map(|&q| q as u8));
        for s in self.bsums {
            out.extend_from_slice(&s.to_le_bytes());
        }
    }
}

/// `nearest_int` (ggml-quants.c:621): round to nearest, ties to even, via the 1.5*2^23 trick.
#[inline(always)]
fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0f32;
    let i = val.to_bits() as i32;
    (i & 0x007f_ffff) - 0x0040_0000
}

/// `quantize_row_q8_K_ref`: per 256 values, `max` is the first value of largest magnitude (signed),
/// `iscale = -127/max`, `q = min(127, nearest_int(iscale*x))`, `d = 1/iscale`.
/// An all-zero block gets `d = 0`, `qs = 0` (ggml leaves its `bsums` unwritten; they only ever
/// meet `d = 0`, so zeros are equivalent).
pub fn quantize_row_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(
        x.len(),
        out.len() * QK_K,
        "quantize_row_q8_k: {} values for {} blocks",
        x.len(),
        out.len()
    );
    for (xb, y) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax == 0.0 {
            *y = BlockQ8K::ZERO;
            continue;
        }
        let iscale = -127.0f32 / max;
        for (q, &v) in y.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (j, s) in y.bsums.iter_mut().enumerate() {
            *s = y.qs[16 * j..16 * j + 16]
                .iter()
                .map(|&q| q as i32)
                .sum::<i32>() as i16;
        }
        y.d = 1.0f32 / iscale;
    }
}

/// `quantize_row_q8_0`, AVX2 branch: `amax = max|x|`, `d = amax/127` stored as f16,
/// `id = 127/amax` (0 when amax is 0), `q = round_half_even(x*id)` (`_mm256_round_ps`, mode 0).
/// Writes `x.len()/32` blocks of [`Q8_0_BYTES`] into `out`.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) {
    assert_eq!(x.len() % QK8_0, 0);
    assert_eq!(out.len(), x.len() / QK8_0 * Q8_0_BYTES);
    for (xb, y) in x.chunks_exact(QK8_0).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        // max of |x| over the block; the order of a max does not matter
        let mut amax = 0.0f32;
        for &v in xb {
            let a = v.abs();
            // _mm256_max_ps(a, b) returns b when a is not greater: no NaN in well-formed inputs
            if a > amax {
                amax = a;
            }
        }
        let d = amax / 127.0f32;
        y[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        let id = if amax != 0.0 { 127.0f32 / amax } else { 0.0 };
        for (q, &v) in y[2..].iter_mut().zip(xb) {
            // _mm256_round_ps(_, _MM_ROUND_NEAREST) then cvtps_epi32 and saturating packs
            let r = (v * id).round_ties_even();
            *q = (r as i32).clamp(-128, 127) as i8 as u8;
        }
    }
}

/// `ggml_cpu_fp32_to_fp16` over a row, as little-endian f16 bits.
pub fn quantize_row_f16(x: &[f32], out: &mut [u16]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f32_to_f16(v);
    }
}

/// `ggml_cpu_fp32_to_bf16` over a row.
pub fn quantize_row_bf16(x: &[f32], out: &mut [u16]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f32_to_bf16(v);
    }
}
