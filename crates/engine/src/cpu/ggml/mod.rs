//! ggml-exact CPU kernels (parity mode): reproduce llama.cpp b11434's ggml-cpu arithmetic.

pub mod lanes;
pub mod mul_mat;
pub mod quantize;
pub mod sgemm;
pub mod tiled;
pub mod vec_dot;

pub use mul_mat::{Activations, MatMulPath, mul_mat, mul_mat_act, mul_mat_path};
