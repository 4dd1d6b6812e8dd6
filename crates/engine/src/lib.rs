//! Muser's engine: Muse Glimmer configuration, weights, the forward pass, backends,
//! the KV cache and sampling.

pub mod backend;
pub mod config;
pub mod cpu;
pub mod error;
pub mod formats;
pub mod kv;
pub mod loader;
pub mod muse_glimmer;

pub use backend::{Backend, Batch};
pub use config::{LayerKind, MuseConfig, POST_NORM_EPS};
pub use cpu::{CpuBackend, NumericMode};
pub use error::{Error, Result};
pub use kv::KvType;
pub use loader::ModelFile;
pub use muse_glimmer::MuseGlimmer;
pub mod sampling;
pub mod session;
pub mod speculative;
pub mod state;
pub mod synth;
pub mod tp;

pub use sampling::{Sampler, SamplingParams};
pub use session::{Logits, Session};
