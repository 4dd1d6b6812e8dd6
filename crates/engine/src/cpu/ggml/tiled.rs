//! ggml-cpu's tiled K-quant matmul (tiled/tiled.cpp, tiled/tiled-kernel.cpp), AVX2 microkernel: the
//! path `ggml_compute_forward_mul_mat` takes first for Q4_K / Q5_K / Q6_K weights when the batch has
//! `n_tokens >= 8` (`ggml_tiled_min_batch`; on by default, `GGML_CPU_TILED_MM=0` turns it off).
//!
//! Per output element and per 256-value block `b`, in block order, starting from `acc = 0`:
//! ```text
//! s1  = Σ_s scale[s] * Σ_{e in s} code[e] * q8[e]          exact i32 (Q6_K: code - 32)
//! s2  = Σ_s min[s] * (bsums[2s] + bsums[2s+1])             exact i32 (Q4_K, Q5_K only)
//! res = fp16(x.d) * (float) s1                             _mm256_mul_ps
//! res = fma(-fp16(x.dmin), (float) s2, res)                _mm256_fnmadd_ps (Q4_K, Q5_K)
//! acc = fma(res, y.d, acc)                                 _mm256_fmadd_ps into the window buffer
//! ```
//! Unlike `vec_dot`, `x.d` and `y.d` are never multiplied together first. The window/chunk shapes,
//! the narrow path and the thread count only change which elements are computed together.
//! (Q6_K's act-bias trick, `(q8 + 128) * (q - 32)` minus a precomputed `128 * Σ scale*(q - 32)`, is
//! exact integer arithmetic and gives the same `s1`.)

use muser_gguf::GgmlType;

use super::lanes::fma;
use super::quantize::BlockQ8K;
use super::vec_dot::KBlock;

/// `s1` of one block: `Σ_s scale[s] * Σ_{e in s} code*q8`, for codes with a `bias` subtracted
/// (Q6_K: 32), using `Σ_{e in s} q8 = bsums` to apply the bias exactly.
#[inline(always)]
fn block_s1(b: &KBlock, y: &BlockQ8K, nsub: usize, bias: i32) -> i32 {
    let sub = 256 / nsub;
    let mut s1 = 0i32;
    for s in 0..nsub {
        let mut raw = 0i32;
        for e in s * sub..(s + 1) * sub {
            raw += b.q[e] * y.qs[e] as i32;
        }
        if bias != 0 {
            // bsums are sums of 16: a sub-block of 16 is one bsum
            raw -= bias * y.bsums[s] as i32;
        }
        s1 += b.sc[s] * raw;
    }
    s1
}

/// One output element of the tiled matmul for a K-quant row (decoded blocks) against a Q8_K row.
#[inline(always)]
pub fn tiled_dot_k(ty: GgmlType, x: &[KBlock], y: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    for (b, yb) in x.iter().zip(y) {
        let res = match ty {
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let s1 = block_s1(b, yb, 8, 0);
                let mut s2 = 0i32;
                for s in 0..8 {
                    s2 += b.mn[s] * (yb.bsums[2 * s] as i32 + yb.bsums[2 * s + 1] as i32);
                }
                fma(-b.dmin, s2 as f32, b.d * s1 as f32)
            }
            GgmlType::Q6_K => b.d * block_s1(b, yb, 16, 32) as f32,
            t => panic!("tiled_dot_k: {t} is not a K-quant"),
        };
        acc = fma(res, yb.d, acc);
    }
    acc
}
