//! The elementwise ops of the muse-glimmer graph with ggml-cpu's arithmetic, and `get_rows`.
//!
//! - `ggml_sigmoid`: `1.f / (1.f + expf(-x))` with glibc's `expf` (unary-ops.cpp:31).
//! - `ggml_tanh`: glibc `tanhf` (unary-ops.cpp:19).
//! - `ggml_swiglu_split(a, b)` (build_ffn with LLM_FFN_SILU + LLM_FFN_PAR, llama-graph.cpp):
//!   `ggml_vec_swiglu_f32` (vec.cpp:417) per row: groups of 8 use `ggml_v_silu(a) * b` (ggml's own
//!   vector exp, not libm), the leftovers `ggml_silu_f32(a) * b` with libm `expf`.
//! - `ggml_silu`: `ggml_vec_silu_f32`, same split.
//! - `ggml_scale(x, s)` (b = 0): `x * s`; `ggml_add`, `ggml_mul`: `a + b`, `a * b`.
//! - `ggml_get_rows`: `ggml_get_type_traits(type)->to_float`, i.e. ggml-base's dequantize_row_*
//!   (compiled without `-march=native`: no FMA, the same bits as gguf-py's numpy and
//!   [`crate::formats::dequantize_row`]); f16/bf16 widen exactly.
//!
//! Rust's `f32::exp` and `f32::tanh` call the same glibc `expf` / `tanhf` (same ifunc variant on the
//! same CPU) as ggml.

use muser_gguf::GgmlType;

use super::lanes::{silu_scalar, v_silu, with_avx2_fma};

/// `ggml_sigmoid`, in place.
pub fn sigmoid(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = 1.0f32 / (1.0f32 + (-*v).exp());
    }
}

/// `ggml_tanh`, in place.
pub fn tanh(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = v.tanh();
    }
}

/// `ggml_scale(x, s)`, in place.
pub fn scale(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// `ggml_add(a, b)` into `a`.
pub fn add(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "add: lengths differ");
    for (x, &y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// `ggml_mul(a, b)` into `a`.
pub fn mul(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "mul: lengths differ");
    for (x, &y) in a.iter_mut().zip(b) {
        *x *= y;
    }
}

/// `ggml_swiglu_split(gate, up)` of one row: `silu(gate) * up` into `out`. Rows are independent
/// but the group-of-8 split restarts at every row: call it per row (`ne0`).
pub fn swiglu_row(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = gate.len();
    assert!(
        up.len() == n && out.len() == n,
        "swiglu_row: lengths differ"
    );
    let n8 = n & !7;
    with_avx2_fma(
        #[inline(always)]
        || {
            for i in 0..n8 {
                out[i] = v_silu(gate[i]) * up[i];
            }
        },
    );
    for i in n8..n {
        out[i] = silu_scalar(gate[i]) * up[i];
    }
}

/// `ggml_silu` of one row, in place.
pub fn silu_row(x: &mut [f32]) {
    let n8 = x.len() & !7;
    with_avx2_fma(
        #[inline(always)]
        || {
            for v in x[..n8].iter_mut() {
                *v = v_silu(*v);
            }
        },
    );
    for v in x[n8..].iter_mut() {
        *v = silu_scalar(*v);
    }
}

/// The final logit softcap of muse-glimmer.cpp: `ggml_scale(1/cap)`, `ggml_tanh`, `ggml_scale(cap)`
/// (`1/cap` is rounded to f32 first, as the C++ computes `1.0f / cap`).
pub fn softcap(x: &mut [f32], cap: f32) {
    let inv = 1.0f32 / cap;
    for v in x.iter_mut() {
        *v = (*v * inv).tanh() * cap;
    }
}

/// `ggml_get_rows` of one row of a `ty` tensor (`row` is that row's bytes).
pub fn get_row(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    crate::formats::dequantize_row(ty, row, out);
}
