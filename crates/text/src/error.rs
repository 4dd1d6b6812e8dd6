//! The one error type of the text layer.

/// Why text could not be read, written, rendered or parsed. Every message names the input at fault
/// and, where there is one, what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// The GGUF lacks a tokenizer key, or holds it with the wrong type.
    #[error("GGUF tokenizer: {0}")]
    Vocab(String),
    /// The GGUF's tokenizer is of a kind Muser does not implement.
    #[error("unsupported tokenizer: {0}")]
    Unsupported(String),
    /// The tokenizer library refused the vocabulary or the text.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Input bytes that are not UTF-8; `offset` is the first bad byte.
    #[error("input is not valid UTF-8: invalid byte at offset {offset}")]
    InvalidUtf8 { offset: usize },
    /// Input larger than the configured limit.
    #[error("input of {len} bytes exceeds the limit of {limit} bytes; split it or raise the limit")]
    InputTooLarge { len: usize, limit: usize },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {n_vocab} tokens")]
    UnknownToken { id: i64, n_vocab: usize },
    /// The chat template failed to compile or to render; the message carries the template line.
    #[error("chat template: {0}")]
    Template(String),
    /// A message, tool or argument that does not have the shape the chat API expects.
    #[error("invalid chat input: {0}")]
    InvalidChat(String),
    /// A grammar or JSON schema that cannot constrain generation (its text, a rule, a keyword).
    #[error("grammar: {0}")]
    Grammar(String),
    /// A file could not be read.
    #[error("{path}: {msg}")]
    Io { path: String, msg: String },
}

pub type Result<T> = std::result::Result<T, TextError>;
