//! Text in, text out for Muse Glimmer: the GGUF's byte-level BPE tokenizer, a streaming
//! detokenizer with stop strings, the chat template (minijinja, byte-identical to transformers'
//! `apply_chat_template`) and the ATEM tool-call / reasoning parser.
//!
//! One chat turn, as `muser chat` or a server runs it (`next_token` stands for the engine):
//!
//! ```no_run
//! use muser_text::{ChatDelta, ChatTemplate, StreamDecoder, Tokenizer, ToolCallParser};
//! # fn next_token(_: &[u32]) -> u32 { 0 }
//! # fn main() -> muser_text::Result<()> {
//! let g = muser_gguf::Gguf::open("model.gguf").map_err(|e| muser_text::TextError::Vocab(e.to_string()))?;
//! let tok = Tokenizer::from_gguf(&g)?;
//! let template = ChatTemplate::from_gguf(&g)?;
//! let messages = serde_json::json!([{"role": "user", "content": "Hi!"}]);
//! // The template writes BOS and the special tokens; user-written ones stay text.
//! let mut ids = template.encode_sanitized(&tok, &messages, None, true, None)?;
//! let parser = ToolCallParser::new(&[]);
//! let mut atem = parser.stream();
//! // Keep special tokens in the text: the parser reads <|message|>, <|eom|>, ...
//! let mut text = StreamDecoder::new(false, Vec::<String>::new());
//! loop {
//!     let id = next_token(&ids);
//!     if tok.eog_ids().contains(&id) {
//!         break;
//!     }
//!     ids.push(id);
//!     for delta in atem.push(&text.push(&tok, id)?) {
//!         if let ChatDelta::Content(s) = delta {
//!             print!("{s}");
//!         }
//!     }
//! }
//! atem.push(&text.finish());
//! atem.finish();
//! let reply = atem.into_message().into_message(); // append to the history
//! # let _ = reply; Ok(()) }
//! ```

pub(crate) mod atem;
mod bpe;
mod byte_level;
mod error;
pub mod grammar;
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
pub use template::{ChatTemplate, KNOWN_ROLES, TEMPLATE_FUEL};
pub use tokenizer::{DEFAULT_MAX_INPUT_BYTES, LLAMA3_REGEX, LLAMA4_REGEX, Tokenizer};
pub use vocab::{PreTokenizer, TokenType, Vocab};
