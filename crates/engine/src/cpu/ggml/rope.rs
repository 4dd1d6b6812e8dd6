//! `ggml_rope_ext` in NORM mode (`GGML_ROPE_TYPE_NORMAL`, adjacent pairs) as ggml-cpu computes it
//! (ops.cpp:6310 `ggml_compute_forward_rope_flt<float>`), for muse-glimmer's parameters:
//! `n_dims = n_rot = head_dim`, `freq_scale = 1`, `ext_factor = 0` (no YaRN: llama-context.cpp:175
//! sets it to 0 unless the scaling type is YaRN), `attn_factor = 1`, no freq factors. With
//! `ext_factor = 0`, `n_ctx_orig`, `beta_fast` and `beta_slow` do not enter the arithmetic.
//!
//! The angle table (`ggml_rope_cache_init`, ops.cpp:6203) is built per position by repeated
//! multiplication: `theta = (float) pos`, then for each pair `cos = cosf(theta) * 1`,
//! `sin = sinf(theta) * 1`, `theta *= theta_scale` with `theta_scale = powf(base, -2.0f/n_dims)`
//! (glibc libm: GCC emits `powf` and `sincosf`).
//!
//! The rotation (`rotate_pairs`, ops.cpp:6291) as GCC compiled it (vectorised with
//! `vfmaddsub`, scalar with `vfmsub`/`vfmadd`): the `x1` products are rounded, the `x0` products
//! fused: `y0 = fma(x0, cos, -(x1*sin))`, `y1 = fma(x0, sin, x1*cos)`.

use super::lanes::{fma, with_avx2_fma};

/// The cos/sin table of one position: `cache[2i] = cos(theta_i)`, `cache[2i+1] = sin(theta_i)`.
pub fn rope_cache(pos: i32, freq_base: f32, n_dims: usize, cache: &mut [f32]) {
    assert_eq!(cache.len(), n_dims);
    let theta_scale = freq_base.powf(-2.0f32 / n_dims as f32);
    let mut theta = pos as i64 as f32;
    for i in (0..n_dims).step_by(2) {
        cache[i] = theta.cos();
        cache[i + 1] = theta.sin();
        theta *= theta_scale;
    }
}

/// Rotate one head (`head.len() == n_dims`) with a table from [`rope_cache`].
#[inline(always)]
pub fn rope_rotate(head: &mut [f32], cache: &[f32]) {
    for i in (0..head.len()).step_by(2) {
        let (c, s) = (cache[i], cache[i + 1]);
        let (x0, x1) = (head[i], head[i + 1]);
        head[i] = fma(x0, c, -(x1 * s));
        head[i + 1] = fma(x0, s, x1 * c);
    }
}

/// RoPE (NORM) of one token's `n_head` heads of `head_dim` values at position `pos`, in place.
pub fn rope_norm(x: &mut [f32], head_dim: usize, pos: i32, freq_base: f32) {
    assert_eq!(
        x.len() % head_dim,
        0,
        "rope_norm: {} values are not heads of {head_dim}",
        x.len()
    );
    let mut cache = vec![0.0f32; head_dim];
    rope_cache(pos, freq_base, head_dim, &mut cache);
    with_avx2_fma(
        #[inline(always)]
        || {
            for head in x.chunks_exact_mut(head_dim) {
                rope_rotate(head, &cache);
            }
        },
    );
}
