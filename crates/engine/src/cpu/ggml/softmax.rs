//! `ggml_soft_max_ext(x, mask, scale, max_bias = 0)` as ggml-cpu computes it
//! (ops.cpp:5813 `ggml_compute_forward_soft_max_f32`), one row:
//! ```text
//! w    = x * scale                      ggml_vec_scale_f32 (plain multiply)
//! w   += 1.0f * mask                    slope = 1 (no ALiBi): the FMA GCC forms is an exact add
//! max  = max(w)
//! e    = ggml_v_expf(w - max)           8 at a time (vec.cpp:531); each group's hsum is added to
//!                                       a double; leftovers: libm expf, added to the double
//! y    = e * (float)(1.0 / sum)         the reciprocal in double, then ggml_vec_scale_f32
//! ```
//! The mask is f32 in the non-flash path (llama-graph.cpp `build_attn_inp_kq_mask`).

use super::lanes::{hsum8, v_expf, with_avx2_fma};

/// One row of `ggml_soft_max_ext`; `mask` (same length, 0 or -inf in llama.cpp) is optional.
pub fn soft_max_ext(x: &[f32], mask: Option<&[f32]>, scale: f32, out: &mut [f32]) {
    let n = x.len();
    assert_eq!(out.len(), n, "soft_max_ext: output length");
    let mut w: Vec<f32> = x.iter().map(|&v| v * scale).collect();
    if let Some(m) = mask {
        assert_eq!(m.len(), n, "soft_max_ext: mask length");
        for (v, &mv) in w.iter_mut().zip(m) {
            *v += mv;
        }
    }
    // ggml_vec_max_f32: `max = MAX(max, x)` with `MAX(a, b) = a > b ? a : b`
    let max = w
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| if m > v { m } else { v });
    let sum = with_avx2_fma(
        #[inline(always)]
        || exp_sum(&w, max, out),
    );
    let inv = (1.0f64 / sum) as f32;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

/// `ggml_vec_soft_max_f32` (vec.cpp:531): `y = exp(x - max)`, returns the sum in double.
#[inline(always)]
pub fn exp_sum(x: &[f32], max: f32, y: &mut [f32]) -> f64 {
    let n = x.len();
    let n8 = n & !7;
    let mut sum = 0.0f64;
    let mut v = [0.0f32; 8];
    for i in (0..n8).step_by(8) {
        for l in 0..8 {
            v[l] = v_expf(x[i + l] - max);
            y[i + l] = v[l];
        }
        sum += hsum8(&v) as f64;
    }
    for i in n8..n {
        let e = (x[i] - max).exp();
        sum += e as f64;
        y[i] = e;
    }
    sum
}
