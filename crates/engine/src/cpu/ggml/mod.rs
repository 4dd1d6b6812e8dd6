//! ggml-exact CPU kernels (parity mode): reproduce llama.cpp b11434's ggml-cpu arithmetic.
