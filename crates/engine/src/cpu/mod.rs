//! The CPU backend.

pub mod ggml;
