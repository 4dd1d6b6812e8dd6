//! The Hadamard rotation llama.cpp applies to Q and K when the K cache is quantized
//! (llama-kv-cache.cpp:321 `attn_rot_k`, llama-graph.cpp `build_attn`: `llama_mul_mat_hadamard`), which
//! the CPU backend computes as `ggml_compute_forward_fwht` (ops.cpp:12255) because the matmul carries
//! the `GGML_HINT_SRC0_IS_HADAMARD` hint.
//!
//! Per group of `n` contiguous values: `y = x * (1.0f / sqrtf(n))`, then the in-place butterflies for
//! `len = 1, 2, 4, .., n/2`: `(u, v) -> (u + v, u - v)` (the SIMD passes' `fma(v, -1, u)` is an exact
//! `u - v`). Q is rotated after RoPE, K after RoPE and before the KV store; V only for a quantized V
//! cache, which needs flash attention (not supported here).

use muser_gguf::GgmlType;

/// `n_rot_k` of llama-kv-cache.cpp:321 for a uniform head size: `Some(n)` when the K cache type is
/// quantized and `head_dim % 64 == 0`: 64, doubled while `head_dim` is a multiple of `2n`.
pub fn k_rotation(k_type: GgmlType, head_dim: usize) -> Option<usize> {
    let quantized = !matches!(k_type, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    if !quantized || head_dim % 64 != 0 {
        return None;
    }
    let mut n = 64;
    while head_dim % (2 * n) == 0 {
        n *= 2;
    }
    Some(n)
}

/// Rotate every group of `n` (a power of two) consecutive values of `x` in place.
pub fn hadamard_rotate(x: &mut [f32], n: usize) {
    assert!(
        n.is_power_of_two(),
        "hadamard_rotate: {n} is not a power of two"
    );
    assert_eq!(
        x.len() % n,
        0,
        "hadamard_rotate: {} values are not groups of {n}",
        x.len()
    );
    let scale = 1.0f32 / (n as f32).sqrt();
    for row in x.chunks_exact_mut(n) {
        for v in row.iter_mut() {
            *v *= scale;
        }
        let mut len = 1;
        while len < n {
            for i in (0..n).step_by(2 * len) {
                for j in 0..len {
                    let (u, v) = (row[i + j], row[i + len + j]);
                    row[i + j] = u + v;
                    row[i + len + j] = u - v;
                }
            }
            len <<= 1;
        }
    }
}
