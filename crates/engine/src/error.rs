//! The engine's one error type. Every message names the key, tensor or input at fault and
//! what was expected, so a user can act on it.

use muser_gguf::GgufError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A metadata key is missing, mistyped or holds a value the engine cannot prove it understands.
    #[error("model configuration: {0}")]
    Config(String),
    /// A tensor is missing, unexpected, mis-shaped, of an unsupported type, or fails a probe.
    #[error("model tensors: {0}")]
    Tensor(String),
    /// A request the model cannot serve (token out of range, prompt past the context, ...).
    #[error("invalid input: {0}")]
    Input(String),
    /// The compute backend failed or is unavailable.
    #[error("backend: {0}")]
    Backend(String),
    #[error("{0}")]
    Io(String),
}

pub type Result<T> = std::result::Result<T, Error>;
