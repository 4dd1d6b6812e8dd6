//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), as
//! llama-server b11434 serves it (tools/server/server-chat.cpp, `server_chat_convert_anthropic_to_oai`;
//! server-task.cpp, `to_json_anthropic*`): a request is rewritten as an OpenAI chat request and
//! runs the chat endpoint's path (template, tools, grammar, engine); its answer is rewritten as an
//! Anthropic message, or its chunks as Anthropic's stream events.
//!
//! Where this differs from llama-server, on purpose:
//! - what the chat path cannot do is refused by name (400), not dropped: images and documents
//!   (Muse Glimmer reads text), server tools (`web_search_...`, `bash_...`), unknown block types;
//! - a user message's `tool_result` blocks become `tool` messages *before* the message's text
//!   (they answer the assistant's calls, which come before it);
//! - `tool_choice: {"type": "tool", "name": N}` forces that tool (llama-server forces any tool),
//!   `{"type": "none"}` offers none;
//! - stream blocks are numbered in the order they open (thinking, text and tool uses as the
//!   model writes them), each stopped before the next starts;
//! - `stop_reason` is `stop_sequence`, with the string, when a stop sequence ended the answer.
//!
//! `thinking.budget_tokens` is not enforced (the model's reasoning is not cut), as llama-server
//! b11434 does not for this model (common/parsers/muse-glimmer.cpp sets no thinking tags, so its
//! reasoning budget never starts); `metadata`,
//! `service_tier`, `cache_control` and `disable_parallel_tool_use` are accepted and have no effect.
//! The chat endpoint's extensions `seed`, `min_p`, `repetition_penalty`, `presence_penalty`,
//! `frequency_penalty`, `ignore_eos`, `reasoning_effort` and `chat_template_kwargs` pass through.

use std::convert::Infallible;

use axum::http::{HeaderValue, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use serde_json::{Map, Value, json};

use crate::adapt::{Kind, Op, Translate, ends, fold, push_text};
use crate::error::ApiError;

/// Anthropic's error object for `e`, `{"type": "error", "error": {"type", "message"}}`.
pub fn error_body(e: &ApiError) -> Value {
    let kind = match e.status.as_u16() {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": e.message}})
}

/// `e` as an Anthropic error response (its status and `retry-after` kept).
pub fn error_response(e: ApiError) -> Response {
    let mut r = (e.status, axum::Json(error_body(&e))).into_response();
    if let Some(s) = e.retry_after {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(param, message)
}

fn text_of_blocks(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (i, b) in blocks.iter().enumerate() {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => match b.get("text") {
                        Some(Value::String(t)) => out.push_str(t),
                        _ => {
                            return Err(bad(
                                param,
                                format!("{param}[{i}]: a text block needs a string text"),
                            ));
                        }
                    },
                    Some(t) => {
                        return Err(ApiError::unsupported(
                            param,
                            format!("{param}[{i}]: {t:?} blocks are not read here: only text"),
                        ));
                    }
                    None => return Err(bad(param, format!("{param}[{i}]: a block needs a type"))),
                }
            }
            Ok(out)
        }
        Value::Null => Ok(String::new()),
        _ => Err(bad(
            param,
            format!("{param} must be a string or a list of text blocks"),
        )),
    }
}

/// One Anthropic message as OpenAI chat messages (a user message with tool results may give
/// several: the `tool` messages, then its text).
fn convert_message(i: usize, m: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let Some(m) = m.as_object() else {
        return Err(bad("messages", format!("{at} must be an object")));
    };
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        Some(r) => {
            return Err(bad(
                "messages",
                format!(
                    "{at}.role is {r:?}: user or assistant (the system prompt is the top-level system field)"
                ),
            ));
        }
        None => return Err(bad("messages", format!("{at} needs a role"))),
    };
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(b)) => b,
        _ => {
            return Err(bad(
                "messages",
                format!("{at}.content must be a string or a list of content blocks"),
            ));
        }
    };
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let here = format!("{at}.content[{j}]");
        let s = |k: &str| b.get(k).and_then(Value::as_str);
        match s("type") {
            Some("text") => match s("text") {
                Some(t) => text.push_str(t),
                None => {
                    return Err(bad(
                        "messages",
                        format!("{here}: a text block needs a string text"),
                    ));
                }
            },
            Some("thinking") if role == "assistant" => {
                reasoning.push_str(s("thinking").unwrap_or_default())
            }
            // Encrypted reasoning of another model: nothing of it can be shown to this one.
            Some("redacted_thinking") if role == "assistant" => {}
            Some("tool_use") if role == "assistant" => {
                let (Some(id), Some(name)) = (s("id"), s("name")) else {
                    return Err(bad(
                        "messages",
                        format!("{here}: a tool_use block needs an id and a name"),
                    ));
                };
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                if !input.is_object() {
                    return Err(bad(
                        "messages",
                        format!("{here}: a tool_use block's input must be an object"),
                    ));
                }
                calls.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": input.to_string()}}));
            }
            Some("tool_result") if role == "user" => {
                let Some(id) = s("tool_use_id") else {
                    return Err(bad(
                        "messages",
                        format!("{here}: a tool_result block needs a tool_use_id"),
                    ));
                };
                let content = text_of_blocks(
                    b.get("content").unwrap_or(&Value::Null),
                    &format!("{here}.content"),
                )
                .map_err(|e| bad("messages", e.message))?;
                results.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            Some(t @ ("image" | "document" | "search_result")) => {
                return Err(ApiError::unsupported(
                    "messages",
                    format!("{here}: {t} blocks are not supported: Muse Glimmer reads text"),
                ));
            }
            Some(t) => {
                return Err(ApiError::unsupported(
                    "messages",
                    format!("{here}: a {t:?} block is not read in a {role} message"),
                ));
            }
            None => return Err(bad("messages", format!("{here} needs a type"))),
        }
    }
    let answered = !results.is_empty();
    out.extend(results);
    if role == "user" {
        // A message of tool results alone adds no user turn.
        if !text.is_empty() || !answered {
            out.push(json!({"role": "user", "content": text}));
        }
        return Ok(());
    }
    let mut msg = Map::new();
    msg.insert("role".into(), json!("assistant"));
    msg.insert("content".into(), json!(text));
    if !calls.is_empty() {
        msg.insert("tool_calls".into(), Value::Array(calls));
    }
    if !reasoning.is_empty() {
        msg.insert("reasoning_content".into(), json!(reasoning));
    }
    out.push(Value::Object(msg));
    Ok(())
}

/// `text` with the per-request stamp of a Claude Code system prompt
/// (`x-anthropic-billing-header: ...; cch=XXXXX;...`) made constant, as llama-server b11434
/// does (server-chat.cpp, `normalize_anthropic_billing_header`): the five characters after
/// `cch=` become `fffff` when a `;` follows them. The stamp changes with every request and sits
/// at the start of the prompt, so without this no request would reuse another's cache.
fn without_billing_stamp(text: &str) -> String {
    const HEADER: &str = "x-anthropic-billing-header:";
    const STAMP: usize = 5;
    let mut t = text.to_string();
    if !t.starts_with(HEADER) {
        return t;
    }
    if let Some(at) = t[HEADER.len()..].find("cch=").map(|i| HEADER.len() + i + 4)
        && t.as_bytes().get(at + STAMP) == Some(&b';')
        && t.is_char_boundary(at)
        && t.is_char_boundary(at + STAMP)
    {
        t.replace_range(at..at + STAMP, "fffff");
    }
    t
}

/// An Anthropic Messages request as an OpenAI chat request for the chat path (whose chunks,
/// with their usage, `message` and `events` rewrite).
pub fn to_chat_request(body: Value) -> Result<Value, ApiError> {
    let Value::Object(b) = body else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    };
    let mut messages = Vec::new();
    match b.get("system") {
        None | Some(Value::Null) => {}
        Some(v) => {
            // Each text of the system prompt stamped as llama-server stamps it.
            let text = match v {
                Value::Array(blocks) => blocks
                    .iter()
                    .enumerate()
                    .map(|(i, b)| {
                        text_of_blocks(&Value::Array(vec![b.clone()]), "system")
                            .map_err(|mut e| {
                                e.message =
                                    e.message.replacen("system[0]", &format!("system[{i}]"), 1);
                                e
                            })
                            .map(|t| without_billing_stamp(&t))
                    })
                    .collect::<Result<String, ApiError>>()?,
                v => without_billing_stamp(&text_of_blocks(v, "system")?),
            };
            messages.push(json!({"role": "system", "content": text}));
        }
    }
    let Some(Value::Array(list)) = b.get("messages") else {
        return Err(bad("messages", "messages is required: a list of messages"));
    };
    for (i, m) in list.iter().enumerate() {
        convert_message(i, m, &mut messages)?;
    }
    let mut o = Map::new();
    o.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = b.get("tools").filter(|t| !t.is_null()) {
        let Some(tools) = tools.as_array() else {
            return Err(bad("tools", "tools must be a list"));
        };
        let mut fns = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            match t.get("type").and_then(Value::as_str) {
                None | Some("custom") => {}
                Some(k) => {
                    return Err(ApiError::unsupported(
                        "tools",
                        format!(
                            "tools[{i}] is Anthropic's server tool {k:?}, which this server does not run: give a tool with a name and an input_schema"
                        ),
                    ));
                }
            }
            let Some(name) = t.get("name").and_then(Value::as_str) else {
                return Err(bad("tools", format!("tools[{i}] needs a name")));
            };
            let mut f = Map::new();
            f.insert("name".into(), json!(name));
            if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
                f.insert("description".into(), d.clone());
            }
            f.insert(
                "parameters".into(),
                t.get("input_schema")
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object"})),
            );
            fns.push(json!({"type": "function", "function": f}));
        }
        if !fns.is_empty() {
            o.insert("tools".into(), Value::Array(fns));
        }
    }
    if let Some(tc) = b.get("tool_choice").filter(|t| !t.is_null()) {
        let choice = match tc.get("type").and_then(Value::as_str) {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => match tc.get("name").and_then(Value::as_str) {
                Some(n) => json!({"type": "function", "function": {"name": n}}),
                None => return Err(bad("tool_choice", "tool_choice of type tool needs a name")),
            },
            _ => {
                return Err(bad(
                    "tool_choice",
                    "tool_choice must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}",
                ));
            }
        };
        o.insert("tool_choice".into(), choice);
    }
    if let Some(s) = b.get("stop_sequences").filter(|s| !s.is_null()) {
        o.insert("stop".into(), s.clone());
    }
    if let Some(t) = b.get("thinking").filter(|t| !t.is_null()) {
        match t.get("type").and_then(Value::as_str) {
            Some("enabled" | "disabled" | "adaptive") => {}
            _ => {
                return Err(bad(
                    "thinking",
                    "thinking must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}",
                ));
            }
        }
    }
    // Anthropic's sampling fields, and the chat endpoint's extensions an Anthropic request may
    // carry (`seed`, `min_p`, ...): passed as they are, checked by the chat path.
    for k in [
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "chat_template_kwargs",
        "seed",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "ignore_eos",
        "reasoning_effort",
    ] {
        if let Some(v) = b.get(k) {
            o.insert(k.into(), v.clone());
        }
    }
    Ok(Value::Object(o))
}

/// Anthropic's stop reason for an OpenAI choice's finish.
fn stop_reason(finish: Option<&str>, stop_string: Option<&str>) -> &'static str {
    match finish {
        Some("tool_calls") => "tool_use",
        Some("length") => "max_tokens",
        _ if stop_string.is_some() => "stop_sequence",
        _ => "end_turn",
    }
}

/// An Anthropic usage object from OpenAI's.
fn usage(u: &Value) -> Value {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let prompt = n(&u["prompt_tokens"]);
    let cached = n(&u["prompt_tokens_details"]["cached_tokens"]);
    json!({
        "input_tokens": prompt.saturating_sub(cached),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": n(&u["completion_tokens"]),
    })
}

/// A call's arguments (a JSON object's text) as a `tool_use` block's input.
fn tool_input(arguments: &str) -> Value {
    serde_json::from_str::<Value>(arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// The content block an answer's part starts as.
fn block_start(kind: Kind, call: &Option<(String, String)>) -> Value {
    match (kind, call) {
        (Kind::Reasoning, _) => json!({"type": "thinking", "thinking": "", "signature": ""}),
        (Kind::Text, _) => json!({"type": "text", "text": ""}),
        (Kind::Call, c) => {
            let (id, name) = c.clone().unwrap_or_default();
            json!({"type": "tool_use", "id": id, "name": name, "input": {}})
        }
    }
}

/// The delta of an answer's part.
fn block_delta(kind: Kind, text: &str) -> Value {
    match kind {
        Kind::Reasoning => json!({"type": "thinking_delta", "thinking": text}),
        Kind::Text => json!({"type": "text_delta", "text": text}),
        Kind::Call => json!({"type": "input_json_delta", "partial_json": text}),
    }
}

/// The end of a message: its stop reason, stop sequence and usage.
fn message_end(finish: &str, stop_string: Option<String>, u: &Value) -> Value {
    json!({"stop_reason": stop_reason(Some(finish), stop_string.as_deref()),
        "stop_sequence": stop_string, "usage": usage(u)})
}

fn event(name: &str, data: Value) -> SseEvent {
    SseEvent::default().event(name).data(data.to_string())
}

/// The stream events of `ops`.
fn op_events(ops: Vec<Op>) -> Vec<SseEvent> {
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Start { index, kind, call } => out.push(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": index,
                    "content_block": block_start(kind, &call)}),
            )),
            Op::Delta { index, kind, text } => out.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                    "delta": block_delta(kind, &text)}),
            )),
            Op::Stop { index, kind } => {
                if kind == Kind::Reasoning {
                    // Anthropic's clients expect a signature before a thinking block ends; a
                    // local model's reasoning has none (llama-server sends it empty too).
                    out.push(event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": index,
                            "delta": {"type": "signature_delta", "signature": ""}}),
                    ));
                }
                out.push(event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": index}),
                ));
            }
            Op::End {
                finish,
                stop_string,
                usage,
            } => {
                let end = message_end(&finish, stop_string, &usage);
                out.push(event(
                    "message_delta",
                    json!({"type": "message_delta",
                        "delta": {"stop_reason": end["stop_reason"], "stop_sequence": end["stop_sequence"]},
                        "usage": end["usage"]}),
                ));
                out.push(event("message_stop", json!({"type": "message_stop"})));
            }
        }
    }
    out
}

/// The chat path's OpenAI chunks (with their usage) as one Anthropic message, the blocks in
/// the order the model wrote them: what the same request streamed adds up to.
pub async fn message(
    id: String,
    model: String,
    chunks: impl Stream<Item = Result<Value, ApiError>>,
) -> Result<Value, ApiError> {
    let mut content: Vec<Value> = Vec::new();
    let mut arguments: Vec<String> = Vec::new();
    fold(chunks, |op| {
        match op {
            Op::Start { kind, call, .. } => {
                content.push(block_start(kind, &call));
                arguments.push(String::new());
            }
            Op::Delta { index, kind, text } => {
                let (Some(block), Some(args)) = (content.get_mut(index), arguments.get_mut(index))
                else {
                    return None;
                };
                match kind {
                    Kind::Reasoning => push_text(&mut block["thinking"], &text),
                    Kind::Text => push_text(&mut block["text"], &text),
                    Kind::Call => args.push_str(&text),
                }
            }
            Op::Stop { index, kind } => {
                if kind == Kind::Call
                    && let (Some(block), Some(args)) =
                        (content.get_mut(index), arguments.get(index))
                {
                    block["input"] = tool_input(args);
                }
            }
            Op::End {
                finish,
                stop_string,
                usage,
            } => {
                let end = message_end(&finish, stop_string, &usage);
                return Some(json!({
                    "id": id, "type": "message", "role": "assistant", "content": content,
                    "model": model, "stop_reason": end["stop_reason"],
                    "stop_sequence": end["stop_sequence"], "usage": end["usage"],
                }));
            }
        }
        None
    })
    .await
}

/// The chat path's OpenAI chunks as Anthropic's stream events: `message_start`, a `ping`,
/// content blocks (`content_block_start`, `_delta`, `_stop`), `message_delta` with the stop
/// reason and usage, `message_stop`; a failure is an `error` event, the last.
pub fn events(
    id: String,
    model: String,
    prompt_tokens: usize,
    chunks: impl Stream<Item = Result<Value, ApiError>> + Send + 'static,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let s = async_stream::stream! {
        yield Ok(event("message_start", json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "content": [], "model": model,
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}})));
        yield Ok(event("ping", json!({"type": "ping"})));
        let mut t = Translate::default();
        futures_util::pin_mut!(chunks);
        while let Some(c) = chunks.next().await {
            let c = match c {
                Ok(c) => c,
                Err(e) => {
                    yield Ok(event("error", error_body(&e)));
                    return;
                }
            };
            let ops = t.chunk(&c);
            let ended = ends(&ops);
            for e in op_events(ops) {
                yield Ok(e);
            }
            if ended {
                return;
            }
        }
        yield Ok(event("error", error_body(&ApiError::internal("the response ended without its usage"))));
    };
    Sse::new(s).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_with_tools_becomes_the_chat_request() {
        let body = json!({
            "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["END"], "temperature": 0.5, "stream": true,
            "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Call the tool.", "signature": "x"},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "Sunny"}]},
                    {"type": "text", "text": "And tomorrow?"}]},
            ],
        });
        let o = to_chat_request(body).unwrap();
        assert_eq!(
            o["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
                 "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "t1", "content": "Sunny"},
                {"role": "user", "content": "And tomorrow?"},
            ])
        );
        assert_eq!(o["tools"][0]["function"]["name"], "get_weather");
        assert_eq!(
            o["tools"][0]["function"]["parameters"]["properties"]["city"]["type"],
            "string"
        );
        assert_eq!(
            o["tool_choice"],
            json!({"type": "function", "function": {"name": "get_weather"}})
        );
        assert_eq!(o["stop"], json!(["END"]));
        assert_eq!(
            (o["max_tokens"].clone(), o["temperature"].clone()),
            (json!(64), json!(0.5))
        );
    }

    #[test]
    fn a_claude_code_billing_stamp_is_made_constant() {
        let stamp = "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch=a5145;You are Claude Code.";
        let want = "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch=fffff;You are Claude Code.";
        assert_eq!(without_billing_stamp(stamp), want);
        // Anywhere but at the start, without a `;` after five characters, or without the
        // stamp: as it is.
        for t in [
            "Be brief. x-anthropic-billing-header: cch=a5145;",
            "x-anthropic-billing-header: cch=a514;x",
            "x-anthropic-billing-header: cch=a5145",
            "x-anthropic-billing-header: cc_version=2",
            "x-anthropic-billing-header: cch=é1234;",
        ] {
            assert_eq!(without_billing_stamp(t), t);
        }
        for system in [
            json!(stamp),
            json!([{"type": "text", "text": "A. "}, {"type": "text", "text": stamp}]),
        ] {
            let o = to_chat_request(json!({"max_tokens": 8, "system": system, "messages": []}))
                .unwrap();
            assert!(
                o["messages"][0]["content"]
                    .as_str()
                    .unwrap()
                    .ends_with(want),
                "{o}"
            );
        }
        let e = to_chat_request(json!({"max_tokens": 8, "messages": [],
            "system": [{"type": "text", "text": "A"}, {"type": "image"}]}))
        .unwrap_err();
        assert!(e.message.contains("system[1]"), "{e}");
    }

    #[test]
    fn what_the_chat_path_cannot_read_is_refused_by_name() {
        let with =
            |m: Value| to_chat_request(json!({"max_tokens": 8, "messages": [m]})).unwrap_err();
        let e = with(
            json!({"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": ""}}]}),
        );
        assert!(e.message.contains("image"), "{e}");
        let e = with(json!({"role": "system", "content": "x"}));
        assert!(e.message.contains("system"), "{e}");
        let e = with(
            json!({"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}),
        );
        assert!(e.message.contains("tool_use"), "{e}");
        let e = with(
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": 3}]}),
        );
        assert!(e.message.contains("object"), "{e}");
        let e = to_chat_request(json!({"messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]})).unwrap_err();
        assert!(e.message.contains("web_search_20250305"), "{e}");
        let e =
            to_chat_request(json!({"messages": [], "tool_choice": {"type": "tool"}})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let e = to_chat_request(json!({"max_tokens": 8})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert_eq!(error_body(&e)["error"]["type"], "invalid_request_error");
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn fold(chunks: Vec<Value>) -> Value {
        let s = futures_util::stream::iter(chunks.into_iter().map(Ok));
        block_on(message("msg_1".into(), "m".into(), s)).unwrap()
    }

    fn delta(d: Value, finish: Option<&str>) -> Value {
        json!({"choices": [{"index": 0, "delta": d, "finish_reason": finish, "stop_reason": null}]})
    }

    #[test]
    fn chunks_become_a_message_in_the_order_written() {
        let call = |id: &str, args: &str| {
            json!({"tool_calls": [{"index": 0, "id": id, "type": "function",
                "function": {"name": "f", "arguments": args}}]})
        };
        let m = fold(vec![
            delta(json!({"role": "assistant", "content": ""}), None),
            delta(json!({"reasoning_content": "Need "}), None),
            delta(json!({"reasoning_content": "data."}), None),
            delta(json!({"content": "Let me "}), None),
            delta(json!({"content": "look."}), None),
            delta(call("c1", "{\"a\":1}"), None),
            // Text after a call is a block after it, as the model wrote it.
            delta(json!({"content": "and"}), None),
            delta(call("c2", "{}"), Some("tool_calls")),
            json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 4,
                "prompt_tokens_details": {"cached_tokens": 3}}}),
        ]);
        assert_eq!(m["stop_reason"], "tool_use");
        assert_eq!(m["stop_sequence"], Value::Null);
        assert_eq!(
            m["content"],
            json!([
                {"type": "thinking", "thinking": "Need data.", "signature": ""},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}},
                {"type": "text", "text": "and"},
                {"type": "tool_use", "id": "c2", "name": "f", "input": {}},
            ])
        );
        assert_eq!(
            m["usage"],
            json!({"input_tokens": 7, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 3, "output_tokens": 4})
        );
        assert_eq!(
            (m["id"].clone(), m["model"].clone()),
            (json!("msg_1"), json!("m"))
        );
        let usage = json!({"choices": [], "usage": {}});
        let stopped = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "END"}]});
        let m = fold(vec![
            delta(json!({"content": "a"}), None),
            stopped,
            usage.clone(),
        ]);
        assert_eq!(
            (m["stop_reason"].clone(), m["stop_sequence"].clone()),
            (json!("stop_sequence"), json!("END"))
        );
        let m = fold(vec![
            delta(json!({"content": "a"}), Some("length")),
            usage.clone(),
        ]);
        assert_eq!(m["stop_reason"], "max_tokens");
        let m = fold(vec![delta(json!({"content": "a"}), Some("stop")), usage]);
        assert_eq!(m["stop_reason"], "end_turn");
        // A stream without its usage is an error, not a message.
        let s = futures_util::stream::iter(vec![Ok(delta(json!({"content": "a"}), None))]);
        assert!(block_on(message("x".into(), "m".into(), s)).is_err());
    }
}
