//! Muse Glimmer's assistant output: reasoning, answer and ATEM tool calls.
//!
//! An assistant turn is one or more messages (llama.cpp common/parsers/muse-glimmer.cpp):
//! `<|start|>assistant to=RECIPIENT<|message|>BODY` ended by `<|eom|>` (more follow) or `<|eot|>`.
//! The generation prompt already holds the first `<|start|>assistant`, so generated text begins
//! at ` to=` or `<|message|>`. Recipients: `self` is the reasoning channel, `user` (or none) the
//! answer, anything else a tool, whose body is ATEM markup (see [`body`]).
//!
//! The generated text must be detokenized with special tokens kept (`skip_special = false`).
//! Anything that does not follow the format becomes plain content, never an error.

mod body;
pub(crate) mod schema;
mod stream;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};

use crate::error::{Result, TextError};
use crate::message::{Message, Tool, ToolCall};

pub use stream::AtemStream;

/// One piece of a streamed assistant message.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatDelta {
    Content(String),
    Reasoning(String),
    /// A complete tool call (ATEM is only known to be well-formed at its closing tag).
    ToolCall {
        index: usize,
        call: ToolCall,
    },
}

/// The assistant message parsed from a whole generation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedMessage {
    pub content: String,
    pub reasoning_content: String,
    pub tool_calls: Vec<ToolCall>,
}

impl ParsedMessage {
    /// As an OpenAI message: empty content and reasoning become absent.
    pub fn into_message(self) -> Message {
        Message {
            role: "assistant".into(),
            content: (!self.content.is_empty() || self.tool_calls.is_empty())
                .then_some(Value::String(self.content)),
            reasoning_content: (!self.reasoning_content.is_empty())
                .then_some(self.reasoning_content),
            tool_calls: self.tool_calls,
            ..Message::default()
        }
    }

    fn apply(&mut self, d: &ChatDelta) {
        match d {
            ChatDelta::Content(s) => self.content.push_str(s),
            ChatDelta::Reasoning(s) => self.reasoning_content.push_str(s),
            ChatDelta::ToolCall { call, .. } => self.tool_calls.push(call.clone()),
        }
    }
}

/// Which parameters of each offered tool may be strings (taken verbatim); the others are JSON.
#[derive(Debug, Clone, Default)]
pub struct ToolCallParser {
    tools: HashMap<String, HashMap<String, bool>>,
    extract_reasoning: bool,
}

impl ToolCallParser {
    /// A parser for a request that offers `tools` (none: tool-call text stays content).
    pub fn new(tools: &[Tool]) -> Self {
        let mut p = Self {
            tools: HashMap::new(),
            extract_reasoning: true,
        };
        let mut budget = schema::VISIT_BUDGET;
        for t in tools {
            let params = t.function.parameters.clone().unwrap_or(Value::Null);
            let props = params.get("properties").and_then(Value::as_object);
            let kinds = props
                .into_iter()
                .flatten()
                .map(|(name, s)| (name.clone(), schema::may_be_string(s, &params, &mut budget)))
                .collect();
            p.tools.insert(t.function.name.clone(), kinds);
        }
        p
    }

    /// From the request's `tools` JSON (an array of OpenAI tool objects, or null).
    pub fn from_json(tools: Option<&Value>) -> Result<Self> {
        match tools {
            None | Some(Value::Null) => Ok(Self::new(&[])),
            Some(Value::Array(list)) => {
                // OpenAI's form ({"type": "function", "function": {...}}), or the function
                // itself ({"name": ..., "parameters": ...}), which the template renders too.
                let tools = list
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        let def = match t.get("function") {
                            Some(f) => f,
                            None if t.get("name").is_some() => t,
                            None => {
                                return Err(TextError::InvalidChat(format!(
                                    "tools[{i}]: neither a function nor {{\"function\": ...}}"
                                )));
                            }
                        };
                        let function = serde_json::from_value(def.clone())
                            .map_err(|e| TextError::InvalidChat(format!("tools[{i}]: {e}")))?;
                        Ok(Tool {
                            kind: "function".into(),
                            function,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(Self::new(&tools))
            }
            Some(_) => Err(TextError::InvalidChat("tools must be an array".into())),
        }
    }

    /// With `false`, the reasoning channel is returned as content (llama.cpp `--reasoning-format none`).
    pub fn extract_reasoning(mut self, yes: bool) -> Self {
        self.extract_reasoning = yes;
        self
    }

    /// Parses a complete generation (the text after the generation prompt).
    pub fn parse(&self, generated: &str) -> ParsedMessage {
        let mut s = self.stream();
        s.push(generated);
        s.finish();
        s.into_message()
    }

    /// An incremental parser for one generation.
    pub fn stream(&self) -> AtemStream {
        AtemStream::new(self.clone())
    }

    /// The tool calls in an ATEM body, with arguments typed by the tool's schema; `None` if the
    /// body is malformed or names a tool that was not offered.
    fn calls(&self, body: &str, first_index: usize) -> Option<Vec<ToolCall>> {
        let invokes = body::parse(body)?;
        invokes
            .into_iter()
            .enumerate()
            .map(|(i, inv)| {
                let kinds = self.tools.get(&inv.name)?;
                let mut args = Map::new();
                for (name, raw) in inv.params {
                    args.insert(name.clone(), typed_value(&raw, kinds.get(&name).copied()));
                }
                let arguments = serde_json::to_string(&Value::Object(args)).ok()?;
                Some(ToolCall::new(
                    Some(new_call_id(first_index + i)),
                    inv.name,
                    arguments,
                ))
            })
            .collect()
    }
}

/// A parameter value: verbatim for string-typed (and unknown) parameters, JSON otherwise; text
/// that is not JSON stays a string rather than failing the call.
fn typed_value(raw: &str, may_be_string: Option<bool>) -> Value {
    match may_be_string {
        Some(false) => {
            serde_json::from_str(raw.trim()).unwrap_or_else(|_| Value::String(raw.to_string()))
        }
        _ => Value::String(raw.to_string()),
    }
}

/// `call_` and 24 hex digits, unique in this process (OpenAI clients match results by id, and the
/// chat template looks tool names up by id across the whole conversation).
fn new_call_id(index: usize) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mix = |mut z: u64| {
        // splitmix64
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let a = mix(t ^ n.rotate_left(32));
    let b = mix(a ^ index as u64);
    format!("call_{a:016x}{:08x}", b as u32)
}
