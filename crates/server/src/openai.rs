//! The OpenAI request bodies of `/v1/chat/completions` and `/v1/completions`, and their
//! validation into what the engine runs. Fields Muser does not know are ignored (clients send
//! many); fields it knows but cannot honour are refused with a 400 naming them.

use std::collections::HashMap;
use std::sync::Arc;

use muser_engine::SamplingParams;
use muser_text::Tokenizer;
use muser_text::grammar;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::engine::SeqSpec;
use crate::error::ApiError;

/// Most choices (`n`) one request may ask for.
pub const MAX_N: usize = 16;
/// Most stop strings.
pub const MAX_STOPS: usize = 16;
/// Longest stop string, in bytes. Every generated token is checked against every stop string
/// (and each sequence keeps its own copy), so their length is work for the engine's one thread:
/// 16 strings of 480 KB made every other request 27 times slower (2026-12-01). No natural stop
/// string comes near this.
pub const MAX_STOP_BYTES: usize = 1024;
/// Most alternatives per token (`top_logprobs`; OpenAI allows 20): the engine's bound.
pub use muser_engine::sampling::MAX_TOP_LOGPROBS;
/// Most prompts in one `/v1/completions` request.
pub const MAX_PROMPTS: usize = 16;

/// Both endpoints' body: `messages` for chat, `prompt` for completions.
#[derive(Debug, Default, Deserialize)]
pub struct GenRequest {
    pub model: Option<String>,
    pub messages: Option<Value>,
    pub prompt: Option<Value>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// vLLM / llama.cpp extension; 0 or -1 disables.
    pub top_k: Option<i64>,
    /// vLLM / llama.cpp extension.
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub n: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// vLLM extension (llama.cpp's repeat_penalty).
    pub repetition_penalty: Option<f64>,
    pub stop: Option<Stop>,
    /// Chat: a boolean; completions: the number of alternatives (0..=5).
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<i64>,
    pub logit_bias: Option<HashMap<String, f64>>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    /// Whether a forced tool call may be several (default true).
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<Value>,
    /// llama.cpp extension: a JSON schema the output must satisfy.
    pub json_schema: Option<Value>,
    /// llama.cpp extension: a GBNF grammar the output must match.
    pub grammar: Option<String>,
    /// Extension: generate `max_tokens` tokens whatever the model says (load tests).
    pub ignore_eos: Option<bool>,
    /// Extra chat template variables (vLLM's name).
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// OpenAI's: how hard the model reasons (the template's `reasoning_strength`).
    pub reasoning_effort: Option<Value>,
    /// llama.cpp / vLLM extension: end the prompt with the generation prompt (default true).
    pub add_generation_prompt: Option<bool>,
    /// llama.cpp extension: continue the final assistant message (true, "content" or
    /// "reasoning_content"); a final assistant message is continued without it too.
    pub continue_final_message: Option<Value>,
    pub echo: Option<bool>,
    pub suffix: Option<Value>,
    pub best_of: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// Which endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// Sampling and output options common to every choice.
#[derive(Debug, Clone)]
pub struct Options {
    pub n: usize,
    pub params: SamplingParams,
    /// `None`: fill the context.
    pub max_tokens: Option<usize>,
    /// The field it came from (`max_completion_tokens` or `max_tokens`), for errors about it.
    pub max_tokens_param: &'static str,
    pub stops: Vec<String>,
    pub logprobs: Option<usize>,
    /// Completions' `echo`: each choice's text begins with its prompt (and its logprobs with
    /// the prompt's tokens, the first without one).
    pub echo: bool,
    pub logit_bias: Vec<(u32, f32)>,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
    /// What the output must match (`response_format`, `json_schema`, `grammar`).
    pub constrain: Option<Constrain>,
}

/// Longest `grammar` text, in bytes (its rules are parsed on a preparation turn and matched on
/// the engine's thread at every token).
pub const MAX_GRAMMAR_BYTES: usize = 256 * 1024;

/// What a request constrains its output to, as llama.cpp's server reads it
/// (tools/server/server-common.cpp): `response_format` `json_object` (its `schema` if it has one,
/// else any object) or `json_schema` (`json_schema.schema`), the `json_schema` extension, or a
/// GBNF `grammar`; an empty schema means any object.
#[derive(Debug, Clone)]
pub enum Constrain {
    Schema {
        schema: Value,
        param: &'static str,
    },
    Gbnf(String),
    /// A chat answer's call of one of these tools (OpenAI tool objects), in the model's format:
    /// forced (`tool_choice` `required` or a named function), or `lazy` (`auto`: the answer is
    /// free until it begins a call, which must then be well formed).
    ToolCalls {
        tools: Vec<Value>,
        parallel: bool,
        lazy: bool,
    },
}

impl Constrain {
    /// The request's constraint, None for none.
    fn from_request(r: &GenRequest) -> Result<Option<Self>, ApiError> {
        let mut schema = match &r.json_schema {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some((v.clone(), "json_schema")),
            Some(_) => {
                return Err(ApiError::invalid(
                    "json_schema",
                    "json_schema must be a JSON schema object",
                ));
            }
        };
        match &r.response_format {
            None | Some(Value::Null) => {}
            Some(Value::Object(rf)) => match rf.get("type").and_then(Value::as_str) {
                None | Some("text") => {}
                // A null schema is a missing one (llama.cpp's json_value): any object.
                Some("json_object") => {
                    if rf.contains_key("schema") || schema.is_none() {
                        schema = Some((
                            rf.get("schema")
                                .filter(|v| !v.is_null())
                                .cloned()
                                .unwrap_or_else(|| Value::Object(Map::new())),
                            "response_format",
                        ));
                    }
                }
                Some("json_schema") => {
                    let s = rf
                        .get("json_schema")
                        .and_then(|w| w.get("schema"))
                        .filter(|v| !v.is_null())
                        .cloned()
                        .unwrap_or_else(|| Value::Object(Map::new()));
                    schema = Some((s, "response_format"));
                }
                Some(t) => {
                    return Err(ApiError::invalid(
                        "response_format",
                        format!(
                            "response_format type must be one of \"text\", \"json_object\" or \"json_schema\", got \"{t}\""
                        ),
                    ));
                }
            },
            Some(_) => {
                return Err(ApiError::invalid(
                    "response_format",
                    "response_format must be an object",
                ));
            }
        }
        let grammar = r.grammar.as_deref().filter(|g| !g.is_empty());
        match (schema, grammar) {
            (Some(_), Some(_)) => Err(ApiError::invalid(
                "grammar",
                "a grammar and a JSON schema (response_format or json_schema) cannot both be given",
            )),
            (Some((mut schema, param)), None) => {
                if !schema.is_object() {
                    return Err(ApiError::invalid(param, "the schema must be a JSON object"));
                }
                // An absent or empty schema means any object.
                if schema.as_object().is_some_and(Map::is_empty) {
                    schema["type"] = Value::String("object".into());
                }
                Ok(Some(Constrain::Schema { schema, param }))
            }
            (None, Some(g)) if g.len() > MAX_GRAMMAR_BYTES => Err(ApiError::invalid(
                "grammar",
                format!(
                    "a grammar is at most {MAX_GRAMMAR_BYTES} bytes, got {}",
                    g.len()
                ),
            )),
            (None, Some(g)) => Ok(Some(Constrain::Gbnf(g.to_string()))),
            (None, None) => Ok(None),
        }
    }

    /// The GBNF text generation follows, the field its errors name, and the text it is matched
    /// from before the first token (`GENERATION_PROMPT` for a chat's schema or forced call: the
    /// answer's grammar begins with the prompt's last words). A chat's schema constrains the
    /// answer inside the Muse Glimmer format (`chat_response_gbnf`), a forced call likewise
    /// (`chat_tool_calls_gbnf`); a completion's schema, and any `grammar`, the text itself.
    #[allow(clippy::type_complexity)]
    pub fn gbnf(
        &self,
        ep: Endpoint,
    ) -> Result<(String, &'static str, Option<&'static str>), ApiError> {
        let (text, param, prefill) = match (self, ep) {
            (
                Constrain::ToolCalls {
                    tools,
                    parallel,
                    lazy,
                },
                _,
            ) => {
                let specs: Vec<grammar::ToolSpec> = tools
                    .iter()
                    .filter_map(|t| {
                        let f = t.get("function").unwrap_or(t);
                        Some(grammar::ToolSpec {
                            name: f.get("name")?.as_str()?,
                            parameters: f.get("parameters").unwrap_or(&Value::Null),
                        })
                    })
                    .collect();
                // A lazy grammar is fed from its trigger on, never the generation prompt.
                (
                    grammar::chat_tool_calls_gbnf(&specs, *parallel, *lazy),
                    if *lazy { "tools" } else { "tool_choice" },
                    (!*lazy).then_some(grammar::GENERATION_PROMPT),
                )
            }
            (Constrain::Schema { schema, param }, Endpoint::Chat) => (
                grammar::chat_response_gbnf(schema),
                *param,
                Some(grammar::GENERATION_PROMPT),
            ),
            (Constrain::Schema { schema, param }, Endpoint::Completions) => {
                (grammar::schema_to_gbnf(schema), *param, None)
            }
            (Constrain::Gbnf(g), _) => (Ok(g.clone()), "grammar", None),
        };
        let text = text.map_err(|e| ApiError::invalid(param, e.to_string()))?;
        Ok((text, param, prefill))
    }

    /// What a lazy constraint waits for before it constrains (None: it constrains from the
    /// first token).
    pub fn trigger(&self) -> Option<grammar::Trigger> {
        match self {
            Constrain::ToolCalls { lazy: true, .. } => Some(grammar::tool_call_trigger_from),
            _ => None,
        }
    }
}

fn int_in(v: i64, lo: i64, hi: i64, name: &str) -> Result<i64, ApiError> {
    if v < lo || v > hi {
        return Err(ApiError::invalid(
            name,
            format!("{name} must be between {lo} and {hi}, got {v}"),
        ));
    }
    Ok(v)
}

fn float_in(v: f64, lo: f64, hi: f64, name: &str) -> Result<f32, ApiError> {
    if !v.is_finite() || v < lo || v > hi {
        return Err(ApiError::invalid(
            name,
            format!("{name} must be a number between {lo} and {hi}, got {v}"),
        ));
    }
    Ok(v as f32)
}

/// A seed for requests that give none: different per request, as OpenAI's.
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    muser_engine::sampling::Rng::new(t ^ N.fetch_add(1, Ordering::Relaxed).rotate_left(40))
        .next_u64()
}

impl GenRequest {
    /// Check the model name against the one served.
    pub fn check_model(&self, served: &str) -> Result<(), ApiError> {
        match &self.model {
            Some(m) if m != served => Err(ApiError::model_not_found(m, served)),
            _ => Ok(()),
        }
    }

    /// Validate the sampling and output options.
    pub fn options(&self, ep: Endpoint, tok: &Tokenizer) -> Result<Options, ApiError> {
        let echo = self.echo == Some(true);
        if echo && ep == Endpoint::Chat {
            return Err(ApiError::unsupported(
                "echo",
                "echo is a completions field: chat completions do not take it",
            ));
        }
        if self.suffix.as_ref().is_some_and(|s| !s.is_null()) {
            return Err(ApiError::unsupported("suffix", "suffix is not supported"));
        }
        let constrain = Constrain::from_request(self)?;
        let n = int_in(self.n.unwrap_or(1), 1, MAX_N as i64, "n")? as usize;
        if let Some(b) = self.best_of
            && b != n as i64
        {
            return Err(ApiError::unsupported(
                "best_of",
                "best_of is not supported (it must equal n)",
            ));
        }
        let (max_tokens, max_name) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => (Some(m), "max_completion_tokens"),
            (None, m) => (m, "max_tokens"),
        };
        let max_tokens = match max_tokens {
            None => None,
            // With echo, 0 scores the prompt alone (its logprobs) and generates nothing.
            Some(0) if echo => Some(0),
            Some(m) if m < 1 => {
                return Err(ApiError::invalid(
                    max_name,
                    format!(
                        "{max_name} must be at least 1{}, got {m}",
                        if ep == Endpoint::Completions {
                            " (or 0 with echo)"
                        } else {
                            ""
                        }
                    ),
                ));
            }
            Some(m) => Some(usize::try_from(m).unwrap_or(usize::MAX)),
        };
        let top_k = match self.top_k {
            None => 0,
            Some(k) if k < -1 => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("top_k must be -1 or 0 (no limit) or a positive count, got {k}"),
                ));
            }
            Some(k) if k <= 0 => 0,
            Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
        };
        let params = SamplingParams {
            temperature: float_in(self.temperature.unwrap_or(1.0), 0.0, 2.0, "temperature")?,
            top_k,
            top_p: float_in(self.top_p.unwrap_or(1.0), 0.0, 1.0, "top_p")?,
            min_p: float_in(self.min_p.unwrap_or(0.0), 0.0, 1.0, "min_p")?,
            repeat_penalty: float_in(
                self.repetition_penalty.unwrap_or(1.0),
                0.01,
                10.0,
                "repetition_penalty",
            )?,
            frequency_penalty: float_in(
                self.frequency_penalty.unwrap_or(0.0),
                -2.0,
                2.0,
                "frequency_penalty",
            )?,
            presence_penalty: float_in(
                self.presence_penalty.unwrap_or(0.0),
                -2.0,
                2.0,
                "presence_penalty",
            )?,
            penalty_last_n: usize::MAX,
            seed: self.seed.map_or_else(fresh_seed, |s| s as u64),
        };
        if params.top_p == 0.0 {
            return Err(ApiError::invalid("top_p", "top_p must be above 0"));
        }
        let stops = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stops.len() > MAX_STOPS {
            return Err(ApiError::invalid(
                "stop",
                format!("at most {MAX_STOPS} stop strings, got {}", stops.len()),
            ));
        }
        if let Some(long) = stops.iter().find(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "a stop string is at most {MAX_STOP_BYTES} bytes, got one of {}",
                    long.len()
                ),
            ));
        }
        let logprobs = match ep {
            Endpoint::Chat => {
                let on = match &self.logprobs {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => {
                        return Err(ApiError::invalid(
                            "logprobs",
                            "logprobs must be a boolean in chat completions",
                        ));
                    }
                };
                let top = match self.top_logprobs {
                    None => 0,
                    Some(t) => int_in(t, 0, MAX_TOP_LOGPROBS as i64, "top_logprobs")? as usize,
                };
                if top > 0 && !on {
                    return Err(ApiError::invalid(
                        "top_logprobs",
                        "top_logprobs needs logprobs: true",
                    ));
                }
                on.then_some(top)
            }
            Endpoint::Completions => match &self.logprobs {
                None | Some(Value::Null) => None,
                Some(v) => match v.as_i64() {
                    Some(k) => Some(int_in(k, 0, MAX_TOP_LOGPROBS as i64, "logprobs")? as usize),
                    None => {
                        return Err(ApiError::invalid(
                            "logprobs",
                            "logprobs must be an integer in completions",
                        ));
                    }
                },
            },
        };
        let mut logit_bias = Vec::new();
        for (k, &b) in self.logit_bias.iter().flatten() {
            let id = k
                .parse::<u32>()
                .ok()
                .filter(|&i| (i as usize) < tok.n_vocab())
                .ok_or_else(|| {
                    ApiError::invalid(
                        "logit_bias",
                        format!(
                            "logit_bias key '{k}' is not a token id below {}",
                            tok.n_vocab()
                        ),
                    )
                })?;
            logit_bias.push((id, float_in(b, -100.0, 100.0, "logit_bias")?));
        }
        let stream = self.stream.unwrap_or(false);
        Ok(Options {
            n,
            params,
            max_tokens,
            max_tokens_param: max_name,
            stops,
            logprobs,
            echo,
            logit_bias,
            stream,
            include_usage: stream
                && self
                    .stream_options
                    .as_ref()
                    .and_then(|o| o.include_usage)
                    .unwrap_or(false),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            constrain,
        })
    }

    /// The prompts of a completions request: a string, a list of strings, a list of token ids
    /// or a list of such lists.
    pub fn completion_prompts(&self, tok: &Tokenizer) -> Result<Vec<Vec<u32>>, ApiError> {
        let bad = |m: &str| ApiError::invalid("prompt", m.to_string());
        let Some(p) = &self.prompt else {
            return Err(bad("prompt is required"));
        };
        // A completion prompt is raw model input: special-token text in it is read as the
        // special token, as llama-server does (the chat endpoint's messages are not).
        let text = |s: &str| -> Result<Vec<u32>, ApiError> {
            Ok(tok.encode(s, tok.add_bos_default(), true)?)
        };
        let ids = |v: &[Value]| -> Result<Vec<u32>, ApiError> {
            let raw: Vec<i64> = v
                .iter()
                .map(|x| {
                    x.as_i64()
                        .ok_or_else(|| bad("a token id must be an integer"))
                })
                .collect::<Result<_, _>>()?;
            tok.check_ids(&raw)
                .map_err(|e| ApiError::invalid("prompt", e.to_string()))
        };
        // Counted before any is read: each is tokenized, or its ids checked.
        if let Value::Array(a) = p
            && !a.iter().all(Value::is_number)
            && a.len() > MAX_PROMPTS
        {
            return Err(bad(&format!("at most {MAX_PROMPTS} prompts per request")));
        }
        let prompts = match p {
            Value::String(s) => vec![text(s)?],
            Value::Array(a) if a.is_empty() => return Err(bad("prompt is an empty list")),
            Value::Array(a) if a.iter().all(Value::is_string) => a
                .iter()
                .map(|s| text(s.as_str().unwrap_or_default()))
                .collect::<Result<_, _>>()?,
            Value::Array(a) if a.iter().all(Value::is_number) => vec![ids(a)?],
            Value::Array(a) if a.iter().all(Value::is_array) => a
                .iter()
                .map(|x| ids(x.as_array().map_or(&[][..], |v| v.as_slice())))
                .collect::<Result<_, _>>()?,
            _ => {
                return Err(bad(
                    "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids",
                ));
            }
        };
        if prompts.len() > MAX_PROMPTS {
            return Err(bad(&format!("at most {MAX_PROMPTS} prompts per request")));
        }
        if prompts.iter().any(Vec::is_empty) {
            return Err(bad("a prompt encodes to no tokens"));
        }
        Ok(prompts)
    }

    /// `tools` and `tool_choice` for a chat request: the tools to offer, if any, and the
    /// constraint of their calls: forced (`required`: one of them; a named function: that one),
    /// or, with tools and `auto` (the default), lazy (a call the answer begins). A function's `description` and `parameters` are optional in
    /// OpenAI's API, while the template writes both into the system prompt (its `tojson` of a
    /// missing one fails, as it does in transformers): a missing or null description becomes "",
    /// missing parameters an object schema with no properties.
    pub fn chat_tools(&self) -> Result<(Option<Value>, Option<Constrain>), ApiError> {
        let tools = offered_tools(self.tools.as_ref())?;
        let parallel = self.parallel_tool_calls.unwrap_or(true);
        // llama.cpp refuses a grammar of the user's where the answer may call tools.
        let none = matches!(&self.tool_choice, Some(Value::String(s)) if s == "none");
        if tools.is_some() && !none && self.grammar.as_deref().is_some_and(|g| !g.is_empty()) {
            return Err(ApiError::invalid(
                "grammar",
                "a grammar cannot be given with tools (unless tool_choice is \"none\")",
            ));
        }
        let calls = |only: Option<&str>, lazy: bool| -> Result<Option<Constrain>, ApiError> {
            let Some(Value::Array(list)) = &tools else {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "tool_choice forces a tool call, but the request offers no tools",
                ));
            };
            let chosen: Vec<Value> = list
                .iter()
                .filter(|t| only.is_none_or(|n| tool_name(t) == Some(n)))
                .cloned()
                .collect();
            if chosen.is_empty() {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "tool_choice names the function '{}', which is not among the tools",
                        only.unwrap_or_default()
                    ),
                ));
            }
            Ok(Some(Constrain::ToolCalls {
                tools: chosen,
                parallel,
                lazy,
            }))
        };
        let auto = match &self.tool_choice {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => s == "auto",
            _ => false,
        };
        // `auto`, the default: a call the answer begins is constrained from there, as
        // llama.cpp's lazy grammar does (none where no tools are offered).
        if auto {
            let c = if tools.is_some() {
                calls(None, true)?
            } else {
                None
            };
            return Ok((tools, c));
        }
        match &self.tool_choice {
            Some(Value::String(s)) if s == "none" => Ok((None, None)),
            Some(Value::String(s)) if s == "required" => {
                let c = calls(None, false)?;
                Ok((tools, c))
            }
            Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
                let Some(name) = o
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                else {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        "tool_choice {\"type\": \"function\"} needs {\"function\": {\"name\": ...}}",
                    ));
                };
                let c = calls(Some(name), false)?;
                Ok((tools, c))
            }
            _ => Err(ApiError::invalid(
                "tool_choice",
                "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
            )),
        }
    }
}

/// A tool's function name, in either form (`{"function": {...}}` or the function itself).
fn tool_name(t: &Value) -> Option<&str> {
    t.get("function")
        .unwrap_or(t)
        .get("name")
        .and_then(Value::as_str)
}

/// A request's `tools` as the template gets them (None for none): a function's missing or null
/// `description` becomes "", missing `parameters` an object schema with no properties (OpenAI
/// makes both optional; the template writes both). Chat and `/tokenize` both take them so.
pub fn offered_tools(tools: Option<&Value>) -> Result<Option<Value>, ApiError> {
    Ok(match tools {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) if !a.is_empty() => {
            let mut a = a.clone();
            for tool in &mut a {
                let f = match tool.get_mut("function") {
                    Some(f) => f,
                    None => tool,
                };
                if let Some(f) = f.as_object_mut() {
                    if f.get("description").is_none_or(Value::is_null) {
                        f.insert("description".into(), Value::String(String::new()));
                    }
                    if f.get("parameters").is_none_or(Value::is_null) {
                        f.insert(
                            "parameters".into(),
                            serde_json::json!({"type": "object", "properties": {}}),
                        );
                    }
                }
            }
            Some(Value::Array(a))
        }
        Some(Value::Array(_)) => None,
        Some(_) => return Err(ApiError::invalid("tools", "tools must be an array")),
    })
}

/// Only text reaches this model: a chat message's content parts must be `text` parts. An image,
/// audio or file part would be dropped by the template, or become an image marker with no image
/// behind it (the template renders what transformers renders; the server refuses what it cannot
/// serve).
pub fn text_parts_only(messages: &Value) -> Result<(), ApiError> {
    let Some(list) = messages.as_array() else {
        return Ok(()); // the template names a malformed list
    };
    for (i, m) in list.iter().enumerate() {
        let Some(Value::Array(parts)) = m.get("content") else {
            continue;
        };
        for (j, p) in parts.iter().enumerate() {
            let msg = match p.get("type").and_then(Value::as_str) {
                Some("text") if p.get("text").is_some_and(Value::is_string) => continue,
                Some("text") => {
                    format!("message {i}, content part {j}: a text part needs a string 'text'")
                }
                Some(t) => format!(
                    "message {i}, content part {j}: type '{t}' is not supported; this model takes text parts only"
                ),
                None => format!("message {i}, content part {j} has no string 'type'"),
            };
            return Err(ApiError::invalid("messages", msg));
        }
    }
    Ok(())
}

/// One engine sequence per (prompt, choice), checked against the context.
pub fn sequences(
    prompts: &[Vec<u32>],
    opts: &Options,
    n_ctx: usize,
    what: &str,
) -> Result<Vec<SeqSpec>, ApiError> {
    let mut seqs = Vec::with_capacity(prompts.len() * opts.n);
    for (pi, p) in prompts.iter().enumerate() {
        if p.len() >= n_ctx {
            return Err(ApiError::context_length(
                format!(
                    "This model's maximum context length is {n_ctx} tokens. However, your {what} has {} tokens, leaving no room for a completion. Please shorten it.",
                    p.len()
                ),
                what,
            ));
        }
        let max_tokens = match opts.max_tokens {
            None => n_ctx - p.len(),
            Some(m) if m > n_ctx - p.len() => {
                return Err(ApiError::context_length(
                    format!(
                        "This model's maximum context length is {n_ctx} tokens. However, you requested {} tokens ({} in the {what}, {m} in the completion). Please reduce the length of the {what} or the completion.",
                        p.len().saturating_add(m),
                        p.len()
                    ),
                    opts.max_tokens_param,
                ));
            }
            Some(m) => m,
        };
        let prompt: Arc<[u32]> = p.clone().into();
        for c in 0..opts.n {
            let mut params = opts.params.clone();
            // Choices of one request differ, reproducibly for a given seed.
            params.seed = params.seed.wrapping_add(c as u64);
            seqs.push(SeqSpec {
                index: pi * opts.n + c,
                prompt: prompt.clone(),
                params,
                max_tokens,
            });
        }
    }
    Ok(seqs)
}

/// How a chat's prompt ends: the generation prompt or not, and the final assistant message
/// continued, if it is (llama.cpp b11434, tools/server/server-common.cpp and common/chat.cpp).
#[derive(Debug, Default)]
pub struct PromptEnd {
    pub add_generation_prompt: bool,
    pub continued: Option<Continued>,
}

/// A final assistant message the answer continues: its reasoning, and its answer (None: the
/// reasoning is continued).
#[derive(Debug, Clone)]
pub struct Continued {
    pub reasoning: String,
    pub content: Option<String>,
}

impl Continued {
    /// The text after the generation prompt (`<|start|>assistant`) that the answer continues, in
    /// pieces: the format's own (false) or the user's (true), as llama.cpp's Muse Glimmer format
    /// writes it (common/parsers/muse-glimmer.cpp: the reasoning message opened, and for an
    /// answer, closed and the answer's opened).
    pub fn pieces(&self) -> Vec<(&str, bool)> {
        let mut p = vec![
            (" to=self<|message|>", false),
            (self.reasoning.as_str(), true),
        ];
        if let Some(c) = &self.content {
            p.push(("<|eom|><|start|>assistant to=user<|message|>", false));
            p.push((c.as_str(), true));
        }
        p
    }

    /// The pieces as one text.
    pub fn text(&self) -> String {
        self.pieces().into_iter().map(|(t, _)| t).collect()
    }
}

/// `add_generation_prompt` and `continue_final_message` for `messages` (the final message
/// continued is taken off them), as llama.cpp reads them: a final assistant message is
/// continued (its `prefill_assistant`, on by default), its answer where it has one or no
/// reasoning, else its reasoning; continuing with the generation prompt asked for (llama.cpp
/// refuses `continue_final_message` unless `add_generation_prompt` is given false; here only
/// where it is given true), two assistant messages at the end, or a final message with tool
/// calls are refused. A final assistant message with
/// nothing in it is dropped and the generation prompt added (llama.cpp's prompt would then
/// end with no assistant turn open).
pub fn prompt_end(
    messages: &mut Value,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<&Value>,
) -> Result<PromptEnd, ApiError> {
    let param = "continue_final_message";
    let mode = match continue_final_message {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(None),
        Some(Value::String(s)) if s == "content" => Some(Some(true)),
        Some(Value::String(s)) if s == "reasoning_content" => Some(Some(false)),
        Some(_) => {
            return Err(ApiError::invalid(
                param,
                "continue_final_message must be a boolean, \"content\" or \"reasoning_content\"",
            ));
        }
    };
    let list = messages.as_array().map_or(&[][..], Vec::as_slice);
    fn role(m: Option<&Value>) -> Option<&str> {
        m.and_then(|m| m.get("role")).and_then(Value::as_str)
    }
    let last_is_assistant = role(list.last()) == Some("assistant");
    let mut agp = add_generation_prompt.unwrap_or(true);
    let explicit = mode.is_some();
    let mode = match mode {
        Some(m) => {
            if agp && add_generation_prompt.is_some() {
                return Err(ApiError::invalid(
                    "add_generation_prompt",
                    "add_generation_prompt and continue_final_message cannot both be true",
                ));
            }
            if !last_is_assistant {
                return Err(ApiError::invalid(
                    param,
                    "continue_final_message needs the last message to be the assistant's",
                ));
            }
            m
        }
        None if last_is_assistant => {
            if list.len() >= 2 && role(list.get(list.len() - 2)) == Some("assistant") {
                return Err(ApiError::invalid(
                    "messages",
                    "the last two messages are the assistant's: only one can be continued",
                ));
            }
            None
        }
        None => {
            return Ok(PromptEnd {
                add_generation_prompt: agp,
                continued: None,
            });
        }
    };
    let Some(last) = list.last() else {
        return Ok(PromptEnd::default());
    };
    if last
        .get("tool_calls")
        .is_some_and(|t| t.as_array().is_some_and(|a| !a.is_empty()))
    {
        // (Named by the field the client gave: the continuing is otherwise the default's.)
        return Err(ApiError::invalid(
            if explicit { param } else { "messages" },
            "an assistant message with tool calls cannot be continued",
        ));
    }
    let reasoning = match last.get("reasoning_content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                "messages",
                "the last message's reasoning_content must be a string",
            ));
        }
    };
    // Text parts joined as llama.cpp's `render_content` joins them (no delimiter while the text
    // is empty); a list of parts, even empty ones, is an answer to continue.
    let parts = matches!(last.get("content"), Some(Value::Array(a)) if !a.is_empty());
    let content = match last.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for t in parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
            {
                if !text.is_empty() {
                    text.push_str("\n\n");
                }
                text.push_str(t);
            }
            text
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "messages",
                "the last message's content must be a string or a list of text parts",
            ));
        }
    };
    if let Some(a) = messages.as_array_mut() {
        a.pop();
    }
    agp = true;
    if reasoning.is_empty() && content.is_empty() && !parts {
        return Ok(PromptEnd {
            add_generation_prompt: agp,
            continued: None,
        });
    }
    let answer = mode.unwrap_or(!(content.is_empty() && !parts && !reasoning.is_empty()));
    Ok(PromptEnd {
        add_generation_prompt: agp,
        continued: Some(Continued {
            reasoning,
            content: answer.then_some(content),
        }),
    })
}

impl GenRequest {
    /// The chat template's extra variables: `chat_template_kwargs`, with `reasoning_effort` as
    /// llama.cpp b11434 passes it (tools/server/server-common.cpp; common/chat.cpp and
    /// common/jinja/caps.cpp `caps_apply_reasoning_effort`): a non-empty effort becomes the
    /// `reasoning_effort` variable, and `reasoning_strength` too (the variable Muse Glimmer's
    /// template reads) unless the kwargs set it; "none" takes the kwargs' `reasoning_effort`
    /// away.
    pub fn template_kwargs(&mut self) -> Result<Option<Map<String, Value>>, ApiError> {
        let mut kw = self.chat_template_kwargs.take();
        match &self.reasoning_effort {
            None | Some(Value::Null) => {}
            Some(Value::String(e)) if e == "none" => {
                if let Some(k) = kw.as_mut() {
                    k.remove("reasoning_effort");
                }
            }
            Some(Value::String(e)) if e.is_empty() => {}
            Some(Value::String(e)) => {
                kw.get_or_insert_with(Map::new)
                    .insert("reasoning_effort".into(), Value::String(e.clone()));
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "reasoning_effort",
                    "reasoning_effort must be a string",
                ));
            }
        }
        if let Some(k) = kw.as_mut()
            && let Some(Value::String(e)) = k.get("reasoning_effort").cloned()
            && !e.is_empty()
            && !k.contains_key("reasoning_strength")
        {
            k.insert("reasoning_strength".into(), Value::String(e));
        }
        Ok(kw)
    }
}
