//! ggml-exact CPU kernels (parity mode): reproduce llama.cpp b11434's ggml-cpu arithmetic.
//!
//! The anchor is llama.cpp b11434's CPU backend built for x86-64 with AVX2 + FMA + F16C and no
//! AVX-512 (`GGML_NATIVE=ON`, GCC 12), weights not repacked (`--no-repack`), flash attention off,
//! one sequence. Every kernel here computes what that build computes, bit for bit: the same
//! rounding points and the same order of operations, including the SIMD lane structure, the FMAs
//! GCC formed from scalar C, and ggml's own vectorised `expf`. docs/PARITY.md gives the arithmetic
//! of each op with its source line; tests/ggml_*.rs check every op against the real ggml
//! (goldens from tools/ggml-golden).
//!
//! # API
//!
//! Matrix products ([`mul_mat`]):
//! - `mul_mat(ty, w, rows, cols, x, n_tokens, y)`: `y[t*rows + r] = W[r] · x[t]` as
//!   `GGML_OP_MUL_MAT(W, x)` with `W` of type `ty` (`cols` x `rows`, ggml layout, contiguous) and
//!   `x` f32 (`n_tokens` rows of `cols`). Converts `x` to the `vec_dot_type` with ggml's
//!   quantizers and routes to vec_dot / tinyBLAS / the tiled K-quant kernel like ggml
//!   ([`mul_mat_path`]). Types: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K. `n_tokens` must be
//!   the number of columns ggml's mul_mat would see (the routing depends on it, e.g. the last
//!   layer's FFN and the LM head see only the output rows selected by `inp_out_ids`).
//! - [`Activations::new`] + [`mul_mat_act`]: the same, converting the input once for several
//!   weights that read it.
//!
//! Normalisation and elementwise ops:
//! - [`rms_norm`]`(x, eps, out)` one row; [`rms_norm_mul`]`(x, w, eps, out)` = `ggml_rms_norm` then
//!   `ggml_mul` (build_norm); [`rms_norm_rows`] in place over rows (QK-norm per head).
//! - [`rope_norm`]`(x, head_dim, pos, freq_base)`: `ggml_rope_ext`, NORM mode, `n_dims = head_dim`,
//!   `freq_scale = 1`, `ext_factor = 0`, `attn_factor = 1`, for one token's heads, in place.
//! - [`sigmoid`], [`tanh`], [`scale`], [`add`], [`mul`], [`swiglu_row`] (`ggml_swiglu_split`, per row),
//!   [`silu_row`], [`softcap`], [`soft_max_ext`], [`get_row`] (`ggml_get_rows`).
//!
//! KV cache and attention:
//! - [`store_kv_row`]`(kv_type, src, dst)`: one K or V row into the cache type, as the KV store.
//! - [`KvLayout`] / [`IswaLayout`]: llama.cpp's cell (slot) assignment and `n_kv` for one sequence
//!   in the full and the sliding-window cache.
//! - [`attention`]`(params, q, q_pos, keys, out)`: non-flash attention of one layer for one ubatch,
//!   given the sequence's cached keys with their slots (`KvKey`) and the graph's `n_kv`. K cache
//!   f32/f16/bf16/q8_0, V cache f32/f16/bf16.
//! - [`k_rotation`] / [`hadamard_rotate`]: with a quantized (Q8_0) K cache llama.cpp rotates Q and K
//!   (after RoPE, before the store) with a Hadamard transform; do the same.
//!
//! Everything is deterministic: results do not depend on the rayon thread count. It is safe Rust
//! but for the AVX2 integer products of the K-quant dots of fewer than 8 tokens
//! (`vec_dot::vec_dot_k_packed`, taken when the CPU has AVX2 and FMA; each `unsafe` says why it
//! is sound).

pub mod attention;
pub mod hadamard;
pub mod kv;
pub mod kv_layout;
pub mod lanes;
pub mod mul_mat;
pub mod norm;
pub mod quantize;
pub mod rope;
pub mod sgemm;
pub mod softmax;
pub mod tiled;
pub mod unary;
pub mod vec_dot;

pub use attention::{AttnParams, KvKey, attention, attention_by_head, visible};
pub use hadamard::{hadamard_rotate, k_rotation};
pub use kv::{kv_row_bytes, store_kv_row};
pub use kv_layout::{IswaLayout, KvFull, KvLayout, Placement};
pub use mul_mat::{Activations, MatMulPath, mul_mat, mul_mat_act, mul_mat_path, vec_dot_type};
pub use norm::{rms_norm, rms_norm_mul, rms_norm_rows};
pub use rope::{rope_cache, rope_norm, rope_rotate};
pub use softmax::soft_max_ext;
pub use unary::{add, get_row, mul, scale, sigmoid, silu_row, softcap, swiglu_row, tanh};
