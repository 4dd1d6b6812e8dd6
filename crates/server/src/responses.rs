//! OpenAI's Responses API (`POST /v1/responses`, `POST /v1/responses/input_tokens`), as
//! llama-server b11434 serves it (tools/server/server-chat.cpp,
//! `server_chat_convert_responses_to_chatcmpl`; server-task.cpp, `to_json_oaicompat_resp*`): a
//! request is rewritten as a chat request and runs the chat endpoint's path (template, tools,
//! grammars, engine); the chat chunks are read as an answer's parts (`adapt`), folded into a
//! response object or sent as the Responses stream's events by one writer (`Output`), so a whole
//! response is what the same request streamed adds up to.
//!
//! Where this differs from llama-server, on purpose:
//! - what the chat path cannot do is refused by name (400), not dropped: images, files and
//!   audio (Muse Glimmer reads text), hosted tools (`web_search`, `file_search`, ...), item
//!   references, `background`, `conversation`, stored prompts, `include` beyond
//!   `reasoning.encrypted_content`;
//! - output items come in the order the model wrote them (reasoning, text, each call), each
//!   finished before the next is added, and their ids are the same whole and streamed;
//! - an answer cut by `max_output_tokens` is `status: "incomplete"` with
//!   `incomplete_details.reason: "max_output_tokens"` (streamed: `response.incomplete`);
//! - `text.format` (`json_object`, `json_schema`) constrains the answer as the chat endpoint's
//!   `response_format` does.
//!
//! Nothing is stored (`store` is accepted; the response says `false`), so `previous_response_id`
//! is refused, as llama-server does. `truncation: "auto"` runs as `"disabled"`: a conversation
//! over the context is refused, never cut.

use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::{Stream, StreamExt};
use serde_json::{Map, Value, json};

use crate::adapt::{Kind, Op, Translate, fold, push_text};
use crate::error::ApiError;

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(param, message)
}

fn unsupported(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::unsupported(param, message)
}

/// The text of a message's `content`: a string, or a list of `input_text` / `output_text`
/// (or `refusal`) parts, joined.
fn content_text(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                let field = match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => "text",
                    Some("refusal") => "refusal",
                    Some(t @ ("input_image" | "input_file" | "input_audio")) => {
                        return Err(unsupported(
                            "input",
                            format!(
                                "{at}.content[{i}]: {t} parts are not read here: Muse Glimmer reads text"
                            ),
                        ));
                    }
                    Some(t) => {
                        return Err(bad(
                            "input",
                            format!("{at}.content[{i}]: unknown content part type {t:?}"),
                        ));
                    }
                    None => {
                        return Err(bad("input", format!("{at}.content[{i}] needs a type")));
                    }
                };
                match p.get(field) {
                    Some(Value::String(t)) => out.push_str(t),
                    _ => {
                        return Err(bad(
                            "input",
                            format!("{at}.content[{i}] needs a string {field}"),
                        ));
                    }
                }
            }
            Ok(out)
        }
        _ => Err(bad(
            "input",
            format!("{at}.content must be a string or a list of parts"),
        )),
    }
}

fn str_field<'a>(item: &'a Map<String, Value>, key: &str, at: &str) -> Result<&'a str, ApiError> {
    item.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| bad("input", format!("{at} needs a string {key}")))
}

/// A chat message of `role` saying `content`.
fn message(role: &str, content: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("role".into(), json!(role));
    m.insert("content".into(), json!(content));
    m
}

/// The assistant message that the items of one model turn (reasoning, text, calls) go into:
/// the last message if it is the assistant's, else a new one.
fn assistant(messages: &mut Vec<Map<String, Value>>) -> &mut Map<String, Value> {
    if messages
        .last()
        .is_none_or(|m| m.get("role").and_then(Value::as_str) != Some("assistant"))
    {
        messages.push(message("assistant", ""));
    }
    let last = messages.len() - 1;
    &mut messages[last]
}

fn append(m: &mut Map<String, Value>, key: &str, text: &str) {
    push_text(m.entry(key).or_insert(Value::Null), text);
}

/// One input item as chat messages.
fn convert_item(
    i: usize,
    item: &Value,
    messages: &mut Vec<Map<String, Value>>,
) -> Result<(), ApiError> {
    let at = format!("input[{i}]");
    let Some(item) = item.as_object() else {
        return Err(bad("input", format!("{at} must be an object")));
    };
    let kind = item.get("type").and_then(Value::as_str);
    let role = item.get("role").and_then(Value::as_str);
    match (kind, role) {
        (None | Some("message"), Some(r @ ("user" | "system" | "developer"))) => {
            let content = item
                .get("content")
                .ok_or_else(|| bad("input", format!("{at} needs content")))?;
            let text = content_text(content, &at)?;
            // The chat template knows system and user; a developer message is the system's.
            let role = if r == "developer" { "system" } else { r };
            messages.push(message(role, &text));
        }
        (None | Some("message"), Some("assistant")) => {
            let text = match item.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(c) => content_text(c, &at)?,
            };
            append(assistant(messages), "content", &text);
        }
        (None | Some("message"), Some(r)) => {
            return Err(bad(
                "input",
                format!("{at}.role is {r:?}: user, system, developer or assistant"),
            ));
        }
        (Some("function_call"), _) => {
            let call_id = str_field(item, "call_id", &at)?;
            let name = str_field(item, "name", &at)?;
            let arguments = str_field(item, "arguments", &at)?;
            let call = json!({"id": call_id, "type": "function",
                "function": {"name": name, "arguments": arguments}});
            let m = assistant(messages);
            match m.get_mut("tool_calls") {
                Some(Value::Array(calls)) => calls.push(call),
                _ => {
                    m.insert("tool_calls".into(), json!([call]));
                }
            }
        }
        (Some("function_call_output"), _) => {
            let call_id = str_field(item, "call_id", &at)?;
            let output = match item.get("output") {
                Some(o @ (Value::String(_) | Value::Array(_))) => {
                    content_text(o, &format!("{at}.output"))?
                }
                _ => {
                    return Err(bad(
                        "input",
                        format!("{at} needs an output: a string or a list of input_text parts"),
                    ));
                }
            };
            let mut m = message("tool", &output);
            m.insert("tool_call_id".into(), json!(call_id));
            messages.push(m);
        }
        (Some("reasoning"), _) => {
            // The text of its content (reasoning_text parts), else of its summary.
            let parts = |key: &str| -> String {
                item.get(key)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect()
            };
            let mut text = parts("content");
            if text.is_empty() {
                text = parts("summary");
            }
            append(assistant(messages), "reasoning_content", &text);
        }
        (Some(t), _) => {
            return Err(unsupported(
                "input",
                format!(
                    "{at}: {t:?} items are not read here: messages, function_call, function_call_output and reasoning"
                ),
            ));
        }
        (None, None) => {
            return Err(bad("input", format!("{at} needs a type or a role")));
        }
    }
    Ok(())
}

/// The request's fields a response object repeats, with OpenAI's defaults.
pub type Echo = Map<String, Value>;

/// A Responses request as an OpenAI chat request for the chat path, and the fields its
/// response repeats.
pub fn to_chat_request(body: Value) -> Result<(Value, Echo), ApiError> {
    let Value::Object(b) = body else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    };
    if b.get("previous_response_id")
        .is_some_and(|v| !v.is_null() && v != "")
    {
        return Err(unsupported(
            "previous_response_id",
            "responses are not stored here: send the conversation as input",
        ));
    }
    for (key, why) in [
        (
            "conversation",
            "conversations are not stored here: send them as input",
        ),
        ("prompt", "stored prompts are not kept here"),
    ] {
        if b.get(key).is_some_and(|v| !v.is_null()) {
            return Err(unsupported(key, why));
        }
    }
    if b.get("background").and_then(Value::as_bool) == Some(true) {
        return Err(unsupported(
            "background",
            "background responses are not run here: stream the response instead",
        ));
    }
    if let Some(inc) = b.get("include").filter(|v| !v.is_null()) {
        let Some(list) = inc.as_array() else {
            return Err(bad("include", "include must be a list"));
        };
        for v in list {
            if v != "reasoning.encrypted_content" {
                return Err(unsupported(
                    "include",
                    format!("include {v} is not served here"),
                ));
            }
        }
    }

    let mut messages = Vec::new();
    match b.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(message("system", s)),
        Some(_) => return Err(bad("instructions", "instructions must be a string")),
    }
    match b.get("input") {
        Some(Value::String(s)) => messages.push(message("user", s)),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                convert_item(i, item, &mut messages)?;
            }
        }
        None | Some(Value::Null) => {
            return Err(bad(
                "input",
                "input is required: a string or a list of items",
            ));
        }
        Some(_) => {
            return Err(bad("input", "input must be a string or a list of items"));
        }
    }

    let mut o = Map::new();
    o.insert(
        "messages".into(),
        Value::Array(messages.into_iter().map(Value::Object).collect()),
    );
    if let Some(tools) = b.get("tools").filter(|v| !v.is_null()) {
        let Some(list) = tools.as_array() else {
            return Err(bad("tools", "tools must be a list"));
        };
        let mut out = Vec::new();
        for (i, t) in list.iter().enumerate() {
            match t.get("type").and_then(Value::as_str) {
                Some("function") => {
                    let mut f = t.as_object().cloned().unwrap_or_default();
                    f.remove("type");
                    out.push(json!({"type": "function", "function": f}));
                }
                Some(k) => {
                    return Err(unsupported(
                        "tools",
                        format!("tools[{i}]: {k:?} tools are not run here: only function tools"),
                    ));
                }
                None => return Err(bad("tools", format!("tools[{i}] needs a type"))),
            }
        }
        if !out.is_empty() {
            o.insert("tools".into(), Value::Array(out));
        }
    }
    if let Some(tc) = b.get("tool_choice").filter(|v| !v.is_null()) {
        let chat = match tc {
            Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => tc.clone(),
            Value::Object(m) if m.get("type").and_then(Value::as_str) == Some("function") => {
                let name = m.get("name").and_then(Value::as_str).ok_or_else(|| {
                    bad(
                        "tool_choice",
                        "a function tool_choice needs the function's name",
                    )
                })?;
                json!({"type": "function", "function": {"name": name}})
            }
            _ => {
                return Err(unsupported(
                    "tool_choice",
                    format!(
                        "tool_choice {tc} is not served here: auto, none, required or a function"
                    ),
                ));
            }
        };
        o.insert("tool_choice".into(), chat);
    }
    if let Some(n) = b.get("max_output_tokens").filter(|v| !v.is_null()) {
        o.insert("max_tokens".into(), n.clone());
    }
    if let Some(effort) = b
        .get("reasoning")
        .and_then(|r| r.get("effort"))
        .filter(|v| !v.is_null())
    {
        o.insert("reasoning_effort".into(), effort.clone());
    }
    if let Some(format) = b
        .get("text")
        .and_then(|t| t.get("format"))
        .filter(|v| !v.is_null())
    {
        match format.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => {
                o.insert("response_format".into(), json!({"type": "json_object"}));
            }
            Some("json_schema") => {
                let mut schema = format.as_object().cloned().unwrap_or_default();
                schema.remove("type");
                o.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": schema}),
                );
            }
            _ => {
                return Err(bad(
                    "text.format",
                    format!("text.format {format} is not one of text, json_object, json_schema"),
                ));
            }
        }
    }
    if let Some(t) = b.get("truncation").filter(|v| !v.is_null())
        && !matches!(t.as_str(), Some("auto" | "disabled"))
    {
        return Err(bad("truncation", "truncation is auto or disabled"));
    }
    for k in [
        "model",
        "temperature",
        "top_p",
        "stream",
        "parallel_tool_calls",
        // Extensions the chat endpoint takes.
        "top_k",
        "min_p",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "stop",
        "ignore_eos",
        "chat_template_kwargs",
    ] {
        if let Some(v) = b.get(k) {
            o.insert(k.into(), v.clone());
        }
    }

    let mut echo = Echo::new();
    let get = |k: &str, default: Value| {
        b.get(k)
            .cloned()
            .filter(|v| !v.is_null())
            .unwrap_or(default)
    };
    echo.insert("instructions".into(), get("instructions", Value::Null));
    echo.insert(
        "max_output_tokens".into(),
        get("max_output_tokens", Value::Null),
    );
    echo.insert(
        "parallel_tool_calls".into(),
        get("parallel_tool_calls", json!(true)),
    );
    echo.insert("temperature".into(), get("temperature", json!(1.0)));
    echo.insert("top_p".into(), get("top_p", json!(1.0)));
    echo.insert("tool_choice".into(), get("tool_choice", json!("auto")));
    echo.insert("tools".into(), get("tools", json!([])));
    echo.insert(
        "text".into(),
        get("text", json!({"format": {"type": "text"}})),
    );
    echo.insert(
        "reasoning".into(),
        get("reasoning", json!({"effort": null, "summary": null})),
    );
    echo.insert("truncation".into(), get("truncation", json!("disabled")));
    echo.insert("metadata".into(), get("metadata", json!({})));
    echo.insert("user".into(), get("user", Value::Null));
    echo.insert("previous_response_id".into(), Value::Null);
    echo.insert("store".into(), json!(false));
    echo.insert("background".into(), json!(false));
    Ok((Value::Object(o), echo))
}

/// A chat path's error about a field, renamed to the Responses request's field it came from.
pub fn own_names(mut e: ApiError) -> ApiError {
    const NAMES: [(&str, &str); 4] = [
        ("max_tokens", "max_output_tokens"),
        ("response_format", "text.format"),
        ("reasoning_effort", "reasoning.effort"),
        ("messages", "input"),
    ];
    if let Some(p) = e.param.clone()
        && let Some((chat, own)) = NAMES.iter().find(|(chat, _)| {
            p == *chat || p.starts_with(&format!("{chat}.")) || p.starts_with(&format!("{chat}["))
        })
    {
        e.param = Some(p.replacen(chat, own, 1));
        e.message = e.message.replacen(chat, own, 1);
    }
    e
}

/// OpenAI's Responses usage from the chat path's (its `input_tokens` count the cached ones
/// too). The chat path does not count the reasoning's tokens apart, so no
/// `output_tokens_details` is given.
fn usage(u: &Value) -> Value {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let (input, output) = (n(&u["prompt_tokens"]), n(&u["completion_tokens"]));
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": n(&u["prompt_tokens_details"]["cached_tokens"])},
        "output_tokens": output,
        "total_tokens": input + output,
    })
}

/// One event of the Responses stream: its type and data (the data's `type` is the same).
pub struct Event(pub &'static str, pub Value);

/// Writes a response from an answer's parts: its output items, and for a stream the events
/// that add them up. The whole path applies the same parts and keeps the final object.
pub struct Output {
    id: String,
    model: String,
    created_at: u64,
    echo: Echo,
    items: Vec<Value>,
    /// The response once its last part has come.
    done: Option<Value>,
}

impl Output {
    pub fn new(id: String, model: String, echo: Echo) -> Self {
        let created_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Output {
            id,
            model,
            created_at,
            echo,
            items: Vec::new(),
            done: None,
        }
    }

    /// The response object as it stands.
    fn object(&self, status: &str) -> Value {
        let mut r = Map::new();
        r.insert("id".into(), json!(self.id));
        r.insert("object".into(), json!("response"));
        r.insert("created_at".into(), json!(self.created_at));
        r.insert("status".into(), json!(status));
        r.insert("model".into(), json!(self.model));
        r.insert("output".into(), json!(self.items));
        r.insert("error".into(), Value::Null);
        r.insert("incomplete_details".into(), Value::Null);
        r.extend(self.echo.clone());
        Value::Object(r)
    }

    /// The events that open a stream.
    pub fn begin(&self) -> Vec<Event> {
        let r = self.object("in_progress");
        vec![
            Event("response.created", json!({"response": r})),
            Event("response.in_progress", json!({"response": r})),
        ]
    }

    /// The response, once the answer has ended.
    pub fn take(&mut self) -> Option<Value> {
        self.done.take()
    }

    /// Applies one part step: the events it makes.
    pub fn apply(&mut self, op: Op) -> Vec<Event> {
        let mut ev = Vec::new();
        match op {
            Op::Start { index, kind, call } => {
                let item = match kind {
                    Kind::Reasoning => json!({"id": format!("rs_{}_{index}", self.id_tail()),
                        "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}),
                    Kind::Text => json!({"id": format!("msg_{}_{index}", self.id_tail()),
                        "type": "message", "role": "assistant", "content": [], "status": "in_progress"}),
                    Kind::Call => {
                        let (call_id, name) = call.unwrap_or_default();
                        json!({"id": format!("fc_{call_id}"), "type": "function_call",
                            "call_id": call_id, "name": name, "arguments": "", "status": "in_progress"})
                    }
                };
                let item_id = item["id"].clone();
                ev.push(Event(
                    "response.output_item.added",
                    json!({"output_index": index, "item": item}),
                ));
                let part = match kind {
                    Kind::Reasoning => Some(json!({"type": "reasoning_text", "text": ""})),
                    Kind::Text => Some(
                        json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
                    ),
                    Kind::Call => None,
                };
                let mut item = item;
                if let Some(part) = part {
                    ev.push(Event(
                        "response.content_part.added",
                        json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
                    ));
                    item["content"] = json!([part]);
                }
                self.items.push(item);
            }
            Op::Delta { index, kind, text } => {
                let Some(item) = self.items.get_mut(index) else {
                    return ev;
                };
                let item_id = item["id"].clone();
                match kind {
                    Kind::Reasoning | Kind::Text => {
                        let mut t = item["content"][0]["text"]
                            .as_str()
                            .unwrap_or("")
                            .to_string();
                        t.push_str(&text);
                        item["content"][0]["text"] = Value::String(t);
                        let mut d = json!({"item_id": item_id, "output_index": index,
                            "content_index": 0, "delta": text});
                        let name = if kind == Kind::Text {
                            d["logprobs"] = json!([]);
                            "response.output_text.delta"
                        } else {
                            "response.reasoning_text.delta"
                        };
                        ev.push(Event(name, d));
                    }
                    Kind::Call => {
                        push_text(&mut item["arguments"], &text);
                        ev.push(Event(
                            "response.function_call_arguments.delta",
                            json!({"item_id": item_id, "output_index": index, "delta": text}),
                        ));
                    }
                }
            }
            Op::Stop { index, kind } => {
                let Some(item) = self.items.get_mut(index) else {
                    return ev;
                };
                item["status"] = json!("completed");
                let item_id = item["id"].clone();
                match kind {
                    Kind::Reasoning | Kind::Text => {
                        let part = item["content"][0].clone();
                        let mut done = json!({"item_id": item_id, "output_index": index,
                            "content_index": 0, "text": part["text"]});
                        let name = if kind == Kind::Text {
                            done["logprobs"] = json!([]);
                            "response.output_text.done"
                        } else {
                            "response.reasoning_text.done"
                        };
                        ev.push(Event(name, done));
                        ev.push(Event(
                            "response.content_part.done",
                            json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
                        ));
                    }
                    Kind::Call => ev.push(Event(
                        "response.function_call_arguments.done",
                        json!({"item_id": item_id, "output_index": index,
                            "name": item["name"], "arguments": item["arguments"]}),
                    )),
                }
                ev.push(Event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item.clone()}),
                ));
            }
            Op::End {
                finish, usage: u, ..
            } => {
                let cut = finish == "length";
                let mut r = self.object(if cut { "incomplete" } else { "completed" });
                if cut {
                    r["incomplete_details"] = json!({"reason": "max_output_tokens"});
                } else {
                    r["completed_at"] = json!(
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs())
                    );
                }
                r["usage"] = usage(&u);
                let name = if cut {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                ev.push(Event(name, json!({"response": r})));
                self.done = Some(r);
            }
        }
        ev
    }

    /// The response id without its `resp_`: the output items' ids are built on it.
    fn id_tail(&self) -> &str {
        self.id.strip_prefix("resp_").unwrap_or(&self.id)
    }
}

/// The chat path's OpenAI chunks (with their usage) as one response object.
pub async fn response(
    mut out: Output,
    chunks: impl Stream<Item = Result<Value, ApiError>>,
) -> Result<Value, ApiError> {
    fold(chunks, |op| {
        out.apply(op);
        out.take()
    })
    .await
}

/// The chat path's OpenAI chunks as the Responses stream: `response.created`,
/// `response.in_progress`, each output item added, its deltas, its `.done` events, then
/// `response.completed` (or `response.incomplete`); every event numbered (`sequence_number`).
/// A failure is an `error` event, the last.
pub fn events(
    mut out: Output,
    chunks: impl Stream<Item = Result<Value, ApiError>> + Send + 'static,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let s = async_stream::stream! {
        let mut seq = 0u64;
        let mut sse = |Event(name, mut data): Event| {
            data["type"] = json!(name);
            data["sequence_number"] = json!(seq);
            seq += 1;
            SseEvent::default().event(name).data(data.to_string())
        };
        for e in out.begin() {
            yield Ok(sse(e));
        }
        let mut t = Translate::default();
        futures_util::pin_mut!(chunks);
        while let Some(c) = chunks.next().await {
            let c = match c {
                Ok(c) => c,
                Err(e) => {
                    yield Ok(sse(Event("error", error_event(&e))));
                    return;
                }
            };
            for op in t.chunk(&c) {
                for e in out.apply(op) {
                    yield Ok(sse(e));
                }
            }
            if out.take().is_some() {
                return;
            }
        }
        let e = ApiError::internal("the response ended without its usage");
        yield Ok(sse(Event("error", error_event(&e))));
    };
    Sse::new(s).keep_alive(KeepAlive::default())
}

/// The Responses stream's `error` event data.
fn error_event(e: &ApiError) -> Value {
    json!({"code": e.code, "message": e.message, "param": e.param})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_the_chat_conversation() {
        let body = json!({
            "model": "m", "instructions": "Be brief.", "max_output_tokens": 64, "stream": true,
            "reasoning": {"effort": "low"}, "seed": 3,
            "tools": [{"type": "function", "name": "get_weather", "description": "Weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
            "input": [
                {"role": "developer", "content": "Use tools."},
                {"role": "user", "content": [{"type": "input_text", "text": "Weather in "},
                                             {"type": "input_text", "text": "Paris?"}]},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Call it."}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
                {"role": "user", "content": "Thanks"},
            ],
        });
        let (o, echo) = to_chat_request(body).unwrap();
        assert_eq!(
            o["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "system", "content": "Use tools."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "Looking.", "reasoning_content": "Call it.",
                 "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
                {"role": "user", "content": "Thanks"},
            ])
        );
        assert_eq!(o["tools"][0]["function"]["name"], "get_weather");
        assert_eq!(o["tools"][0]["type"], "function");
        assert!(o["tools"][0]["function"].get("type").is_none());
        assert_eq!(
            o["tool_choice"],
            json!({"type": "function", "function": {"name": "get_weather"}})
        );
        assert_eq!(o["max_tokens"], 64);
        assert_eq!(o["reasoning_effort"], "low");
        assert_eq!(o["seed"], 3);
        assert_eq!(
            o["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}})
        );
        assert_eq!(echo["max_output_tokens"], 64);
        assert_eq!(echo["store"], false);
        let (o, _) = to_chat_request(json!({"input": "Hi"})).unwrap();
        assert_eq!(o["messages"], json!([{"role": "user", "content": "Hi"}]));
    }

    #[test]
    fn what_the_chat_path_cannot_do_is_refused_by_name() {
        let refused = |b: Value| to_chat_request(b).unwrap_err();
        let e = refused(
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
        );
        assert!(e.message.contains("input_image"), "{e}");
        let e = refused(json!({"input": "x", "previous_response_id": "resp_1"}));
        assert_eq!(e.param.as_deref(), Some("previous_response_id"));
        let e = refused(json!({"input": "x", "tools": [{"type": "web_search"}]}));
        assert!(e.message.contains("web_search"), "{e}");
        let e = refused(json!({"input": "x", "background": true}));
        assert_eq!(e.param.as_deref(), Some("background"));
        let e = refused(json!({"input": "x", "include": ["message.output_text.logprobs"]}));
        assert_eq!(e.param.as_deref(), Some("include"));
        let e = refused(json!({"input": [{"type": "item_reference", "id": "x"}]}));
        assert!(e.message.contains("item_reference"), "{e}");
        let e = refused(json!({"input": [{"type": "function_call", "name": "f"}]}));
        assert!(e.message.contains("call_id"), "{e}");
        let e = refused(json!({"model": "m"}));
        assert_eq!(e.param.as_deref(), Some("input"));
        let e = refused(json!({"input": "x", "text": {"format": {"type": "xml"}}}));
        assert_eq!(e.param.as_deref(), Some("text.format"));
        assert!(
            to_chat_request(json!({"input": "x", "include": ["reasoning.encrypted_content"]}))
                .is_ok()
        );
    }

    fn delta(d: Value, finish: Option<&str>) -> Value {
        json!({"choices": [{"index": 0, "delta": d, "finish_reason": finish, "stop_reason": null}]})
    }

    #[test]
    fn the_stream_adds_up_to_the_whole_response() {
        let chunks = vec![
            delta(json!({"role": "assistant", "content": ""}), None),
            delta(json!({"reasoning_content": "Think."}), None),
            delta(json!({"content": "Hel"}), None),
            delta(json!({"content": "lo"}), None),
            delta(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                "function": {"name": "f", "arguments": "{\"a\":1}"}}]}),
                Some("tool_calls"),
            ),
            json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 4}}}),
        ];
        let mut out = Output::new("resp_x".into(), "m".into(), Echo::new());
        let mut t = Translate::default();
        let mut events: Vec<Event> = out.begin();
        for c in &chunks {
            for op in t.chunk(c) {
                events.extend(out.apply(op));
            }
        }
        let whole = out.take().unwrap();
        assert_eq!(whole["status"], "completed");
        assert_eq!(
            whole["usage"],
            json!({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 5, "total_tokens": 15})
        );
        let output = whole["output"].as_array().unwrap();
        let kinds: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(output[0]["content"][0]["text"], "Think.");
        assert_eq!(output[1]["content"][0]["text"], "Hello");
        assert_eq!(output[2]["call_id"], "call_1");
        assert_eq!(output[2]["arguments"], "{\"a\":1}");
        assert!(output.iter().all(|i| i["status"] == "completed"));
        // A client folding the events: items added in order, texts from their deltas, each
        // item's `.done` the whole's.
        let mut folded: Vec<Value> = Vec::new();
        let mut text = String::new();
        for Event(name, d) in &events {
            match *name {
                "response.output_item.added" => {
                    assert_eq!(d["output_index"], folded.len());
                    folded.push(d["item"].clone());
                }
                "response.output_text.delta" => text.push_str(d["delta"].as_str().unwrap()),
                "response.output_item.done" => {
                    let i = d["output_index"].as_u64().unwrap() as usize;
                    assert_eq!(d["item"], output[i]);
                    assert_eq!(d["item"]["id"], folded[i]["id"]);
                }
                _ => {}
            }
        }
        assert_eq!(folded.len(), 3);
        assert_eq!(text, "Hello");
        let Event(last, data) = events.last().unwrap();
        assert_eq!(*last, "response.completed");
        assert_eq!(data["response"], whole);
        assert_eq!(events[0].0, "response.created");

        // Cut by max_output_tokens: incomplete.
        let mut out = Output::new("resp_y".into(), "m".into(), Echo::new());
        let mut t = Translate::default();
        let mut last = Vec::new();
        for c in [
            delta(json!({"content": "a"}), Some("length")),
            json!({"choices": [], "usage": {}}),
        ] {
            for op in t.chunk(&c) {
                last = out.apply(op);
            }
        }
        let r = out.take().unwrap();
        assert_eq!(r["status"], "incomplete");
        assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(last.last().unwrap().0, "response.incomplete");
    }
}
