//! llamafile's tinyBLAS (llamafile/sgemm.cpp:559), the path ggml-cpu's mul_mat takes for f32 / f16 /
//! bf16 weights when `n_tokens >= 2` and `rows % 4 == 0` (AVX2 build: `KN = 8`, `__m256`).
//!
//! Every output element is one `__m256` accumulator: `acc = fma(a[l..l+8], b[l..l+8], acc)` over the
//! row in steps of 8, then one step over the `k % 8` leftover with masked (zero-filled) loads, then
//! [`hsum8`]. The tile shapes (`mnpack`, `gemm_bloc`) only group elements, they do not change this.
//! (The Q8_0 / Q4_0 tinyBLAS path is the same arithmetic as their `vec_dot`: see
//! [`super::vec_dot::vec_dot_q0_q8_0`].)

use super::lanes::{bf16_to_f32, f16_lut, fma, hsum8};

#[inline(always)]
fn dot8<A: Copy, B: Copy>(a: &[A], b: &[B], fa: impl Fn(A) -> f32, fb: impl Fn(B) -> f32) -> f32 {
    let k = a.len();
    let kk = k - k % 8;
    let mut acc = [0.0f32; 8];
    for (ac, bc) in a[..kk].chunks_exact(8).zip(b[..kk].chunks_exact(8)) {
        for (i, lane) in acc.iter_mut().enumerate() {
            *lane = fma(fa(ac[i]), fb(bc[i]), *lane);
        }
    }
    if kk < k {
        for (i, lane) in acc.iter_mut().enumerate() {
            let (x, y) = if kk + i < k {
                (fa(a[kk + i]), fb(b[kk + i]))
            } else {
                (0.0, 0.0)
            };
            *lane = fma(x, y, *lane);
        }
    }
    hsum8(&acc)
}

/// tinyBLAS<8, __m256, __m256, float, float, float>: one output element.
#[inline(always)]
pub fn sgemm_dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot8(a, b, |v| v, |v| v)
}

/// tinyBLAS<8, __m256, __m256, ggml_fp16_t, ggml_fp16_t, float>: one output element.
#[inline(always)]
pub fn sgemm_dot_f16(a: &[u16], b: &[u16]) -> f32 {
    let lut = f16_lut();
    dot8(a, b, |h| lut[h as usize], |h| lut[h as usize])
}

/// tinyBLAS<8, __m256, __m256, ggml_bf16_t, ggml_bf16_t, float>: one output element.
#[inline(always)]
pub fn sgemm_dot_bf16(a: &[u16], b: &[u16]) -> f32 {
    dot8(a, b, bf16_to_f32, bf16_to_f32)
}
