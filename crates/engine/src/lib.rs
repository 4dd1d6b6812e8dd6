//! Muser's engine: Muse Glimmer configuration, weights, the forward pass, backends,
//! the KV cache and sampling.

pub mod cpu;
pub mod formats;
