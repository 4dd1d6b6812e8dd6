//! Text in, text out for Muse Glimmer: the GGUF's byte-level BPE tokenizer, a streaming
//! detokenizer with stop strings, the chat template (minijinja, byte-identical to transformers'
//! `apply_chat_template`) and the ATEM tool-call / reasoning parser.

mod atem;
mod bpe;
mod byte_level;
mod error;
mod message;
mod pretokenize;
mod pyjson;
mod sanitize;
mod stream;
mod template;
mod tokenizer;
mod vocab;

pub use atem::{AtemStream, ChatDelta, ParsedMessage, ToolCallParser};
pub use error::{Result, TextError};
pub use message::{FunctionCall, FunctionDef, Message, Tool, ToolCall};
pub use stream::{StopReason, StreamDecoder};
pub use template::{ChatTemplate, KNOWN_ROLES};
pub use tokenizer::{DEFAULT_MAX_INPUT_BYTES, LLAMA3_REGEX, LLAMA4_REGEX, Tokenizer};
pub use vocab::{PreTokenizer, TokenType, Vocab};
