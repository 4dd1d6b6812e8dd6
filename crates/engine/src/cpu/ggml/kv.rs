//! Writing K and V rows into the cache, as llama.cpp's KV store does it: `ggml_set_rows` with the
//! cache type's `from_float` (ops.cpp:5446; llama-kv-cache.cpp `cpy_k`, `cpy_v`).
//!
//! K rows are written whole (`n_embd_k_gqa` values); in the non-flash path the V cache is
//! transposed and written one element per row, which for f32/f16/bf16 is the same per-element
//! conversion. A Q8_0 V cache needs flash attention (its rows would be one value long); a Q8_0 K
//! cache turns on llama.cpp's Hadamard rotation of Q and K (llama-kv-cache.cpp:321): rotate the K
//! row with [`super::hadamard_rotate`] before storing it.

use muser_gguf::GgmlType;

use super::lanes::{f32_to_bf16, f32_to_f16};
use super::quantize::{Q8_0_BYTES, QK8_0, quantize_row_q8_0};

/// Bytes per row of `n` values of a cache type.
pub fn kv_row_bytes(kv_type: GgmlType, n: usize) -> usize {
    match kv_type {
        GgmlType::F32 => 4 * n,
        GgmlType::F16 | GgmlType::BF16 => 2 * n,
        GgmlType::Q8_0 => n / QK8_0 * Q8_0_BYTES,
        t => panic!("ggml parity: KV cache type {t} is not supported"),
    }
}

/// Convert one K or V row (`src`, f32) into the cache type, into `dst`
/// (`kv_row_bytes(kv_type, src.len())` bytes): f32 copy, f16 nearest-even (F16C), bf16
/// nearest-even (`GGML_FP32_TO_BF16`), Q8_0 `quantize_row_q8_0`.
pub fn store_kv_row(kv_type: GgmlType, src: &[f32], dst: &mut [u8]) {
    assert_eq!(
        dst.len(),
        kv_row_bytes(kv_type, src.len()),
        "store_kv_row: destination size"
    );
    match kv_type {
        GgmlType::F32 => {
            for (d, &v) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (d, &v) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f32_to_f16(v).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (d, &v) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
            }
        }
        GgmlType::Q8_0 => quantize_row_q8_0(src, dst),
        _ => unreachable!(),
    }
}
