//! RMSNorm and the weight multiply, as ggml-cpu computes `ggml_rms_norm` then `ggml_mul`
//! (llama.cpp's `build_norm(.., LLM_NORM_RMS, ..)`).
//!
//! `ggml_compute_forward_rms_norm_f32` (ops.cpp:4107): the squares are rounded to f32, summed in a
//! double in element order, `mean = (float)(sum / n)`, `scale = 1.0f / sqrtf(mean + eps)` (not
//! rsqrt), `y = x * scale`. The CPU backend fuses RMS_NORM + MUL when the mul follows immediately
//! (ggml-cpu.c:3080): `y = x * scale * w` evaluated as `(x * scale) * w`, which is the same two
//! roundings as the unfused pair, so the fusion does not change a bit.

/// `ggml_rms_norm` of one row.
pub fn rms_norm(x: &[f32], eps: f32, out: &mut [f32]) {
    assert_eq!(
        x.len(),
        out.len(),
        "rms_norm: input and output lengths differ"
    );
    let scale = rms_scale(x, eps);
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * scale;
    }
}

/// `1.0f / sqrtf(mean(x²) + eps)` with ggml's summation.
pub fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let mut sum = 0.0f64;
    for &v in x {
        sum += (v * v) as f64;
    }
    let mean = (sum / x.len() as f64) as f32;
    1.0f32 / (mean + eps).sqrt()
}

/// `ggml_rms_norm` then `ggml_mul` by a weight of the row's length (fused or not: same bits).
pub fn rms_norm_mul(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    assert_eq!(x.len(), w.len(), "rms_norm_mul: weight length");
    assert_eq!(x.len(), out.len(), "rms_norm_mul: output length");
    let scale = rms_scale(x, eps);
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// [`rms_norm`] / [`rms_norm_mul`] over consecutive rows of `n` values (e.g. per head: `n =
/// head_dim`), in place.
pub fn rms_norm_rows(x: &mut [f32], n: usize, w: Option<&[f32]>, eps: f32) {
    assert_eq!(
        x.len() % n,
        0,
        "rms_norm_rows: {} values are not rows of {n}",
        x.len()
    );
    for row in x.chunks_exact_mut(n) {
        let scale = rms_scale(row, eps);
        match w {
            Some(w) => {
                for (v, &g) in row.iter_mut().zip(w) {
                    *v = *v * scale * g;
                }
            }
            None => {
                for v in row.iter_mut() {
                    *v *= scale;
                }
            }
        }
    }
}
