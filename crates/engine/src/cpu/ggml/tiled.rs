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

use super::lanes::{fma, rd_f16};
use super::quantize::{BlockQ8K, QK_K};
use super::vec_dot::{k4_codes, k4_scales_mins, q6_codes};

#[inline(always)]
fn block_s1(q: &[i32; QK_K], y: &[i8; QK_K], sc: &[i32], sub: usize) -> i32 {
    let mut s1 = 0i32;
    for (s, &scale) in sc.iter().enumerate() {
        let mut raw = 0i32;
        for e in s * sub..(s + 1) * sub {
            raw += q[e] * y[e] as i32;
        }
        s1 += scale * raw;
    }
    s1
}

/// One output element of the tiled Q4_K (`ty5 = false`) / Q5_K (`ty5 = true`) matmul.
#[inline(always)]
pub fn tiled_dot_k4(ty5: bool, x: &[u8], y: &[BlockQ8K]) -> f32 {
    let bs = if ty5 { 176 } else { 144 };
    let mut acc = 0.0f32;
    let mut q = [0i32; QK_K];
    for (xb, yb) in x.chunks_exact(bs).zip(y) {
        let (sc, mn) = k4_scales_mins(&xb[4..16]);
        k4_codes(ty5, xb, &mut q);
        let s1 = block_s1(&q, &yb.qs, &sc, 32);
        let mut s2 = 0i32;
        for s in 0..8 {
            s2 += mn[s] * (yb.bsums[2 * s] as i32 + yb.bsums[2 * s + 1] as i32);
        }
        let d0 = rd_f16(xb, 0);
        let dmin0 = rd_f16(xb, 2);
        let mut res = d0 * s1 as f32;
        res = fma(-dmin0, s2 as f32, res);
        acc = fma(res, yb.d, acc);
    }
    acc
}

/// One output element of the tiled Q6_K matmul.
#[inline(always)]
pub fn tiled_dot_q6_k(x: &[u8], y: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    let mut q = [0i32; QK_K];
    for (xb, yb) in x.chunks_exact(210).zip(y) {
        let mut sc = [0i32; 16];
        for (s, &b) in sc.iter_mut().zip(&xb[192..208]) {
            *s = b as i8 as i32;
        }
        q6_codes(xb, &mut q);
        let s1 = block_s1(&q, &yb.qs, &sc, 16);
        let res = rd_f16(xb, 208) * s1 as f32;
        acc = fma(res, yb.d, acc);
    }
    acc
}
