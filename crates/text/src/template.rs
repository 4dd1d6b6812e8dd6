//! The chat template: the GGUF's `tokenizer.chat_template` (or a file) rendered with minijinja,
//! byte-identical to transformers' `apply_chat_template(..., tokenize=False)`.
//!
//! What transformers 5.24 does, and so what this does (utils/chat_template_utils.py):
//! - jinja2 `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with loop controls;
//! - `tojson` = `json.dumps(ensure_ascii=False)`, `raise_exception(msg)`, `strftime_now(fmt)`;
//! - messages: keys whose value is None dropped (`_normalize_chat_messages`), `reasoning_content`
//!   filled from `thinking`/`reasoning` (`_alias_reasoning_fields`);
//! - the tokenizer's special tokens (`bos_token`, ...) and the caller's kwargs in the context.
//!
//! Python methods on values (`.items()`, `.get()`, `.split()`) come from minijinja-contrib's pycompat.

use std::path::Path;

use minijinja::value::{Kwargs, Serde, Value};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, syntax::SyntaxConfig};
use muser_gguf::{Gguf, Value as GgufValue};
use serde_json::{Map, Value as Json};

use crate::error::{Result, TextError};
use crate::message::{Message, Tool};
use crate::pyjson::{self, DumpOptions};
use crate::sanitize;
use crate::tokenizer::Tokenizer;

const NAME: &str = "chat_template";

/// Roles a conversation may hold; anything else is refused before rendering (the Muse Glimmer
/// template would silently drop it, losing the message).
pub const KNOWN_ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    /// Where the template came from, for error messages.
    origin: String,
    /// `bos_token`, `eos_token`, ...: what transformers puts in the context from `special_tokens_map`.
    specials: Map<String, Json>,
    /// The sanitizer of the first tokenizer `encode_sanitized` saw, under its `instance`.
    sanitizer: std::sync::OnceLock<(u64, sanitize::Sanitizer)>,
    /// The first `prompt_ends_with` asked and its answer (a server asks it of every chat).
    ends_with: std::sync::OnceLock<(String, bool)>,
}

/// The fuel of one rendering (minijinja's `fuel`: about one per instruction and one per 64
/// bytes of data created). Muse Glimmer's template renders 30,000 messages with a tool within
/// it (`template_golden.rs`, `a_hostile_template_runs_out_of_fuel`): more than any context holds
/// (at 131,072 tokens and at least 5 tokens a message, 26,215), while a runaway loop stops after
/// about a second of work on one core.
pub const TEMPLATE_FUEL: u64 = 40_000_000;

impl ChatTemplate {
    /// Compiles `source`; `origin` names it in errors ("tokenizer.chat_template", a path).
    pub fn new(source: impl Into<String>, origin: impl Into<String>) -> Result<Self> {
        let source = source.into();
        let origin = origin.into();
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TextError::Template(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        // A template comes from the file (or a path): its loops are bounded by fuel, so a
        // hostile one ends in an error instead of holding a request (or the server) forever.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source.clone())
            .map_err(|e| template_error(&e, &source, &origin))?;
        Ok(Self {
            env,
            source,
            origin,
            specials: Map::new(),
            sanitizer: std::sync::OnceLock::new(),
            ends_with: std::sync::OnceLock::new(),
        })
    }

    /// The GGUF's `tokenizer.chat_template`, with the vocabulary's special tokens in its context.
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let source = match g.get("tokenizer.chat_template") {
            None => {
                return Err(TextError::Template(
                    "the GGUF has no tokenizer.chat_template; pass a template file (--chat-template-file)".into(),
                ));
            }
            Some(v) => v.as_str().ok_or_else(|| {
                TextError::Template(format!(
                    "tokenizer.chat_template should be a string, found {}; pass a template file (--chat-template-file)",
                    v.summary(3)
                ))
            })?,
        };
        let mut t = Self::new(source, "tokenizer.chat_template")?;
        // The token strings straight from the GGUF: building a whole tokenizer here would double the load.
        if let Some(GgufValue::Array(muser_gguf::Array::String(tokens))) =
            g.get("tokenizer.ggml.tokens")
        {
            for (name, key) in [
                ("bos_token", "bos_token_id"),
                ("eos_token", "eos_token_id"),
                ("pad_token", "padding_token_id"),
            ] {
                let id = g
                    .get(&format!("tokenizer.ggml.{key}"))
                    .and_then(GgufValue::as_i64);
                if let Some(s) = id
                    .and_then(|i| usize::try_from(i).ok())
                    .and_then(|i| tokens.get(i))
                {
                    t.specials.insert(name.into(), Json::String(s.clone()));
                }
            }
        }
        Ok(t)
    }

    /// A template file (`--chat-template-file`); call [`set_special_tokens`](Self::set_special_tokens) after.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |msg: String| TextError::Io {
            path: path.display().to_string(),
            msg,
        };
        let bytes = std::fs::read(path).map_err(|e| io(e.to_string()))?;
        let source = String::from_utf8(bytes).map_err(|e| {
            io(format!(
                "not UTF-8 (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ))
        })?;
        Self::new(source, path.display().to_string())
    }

    /// Puts `bos_token`, `eos_token`, `pad_token` (as strings) in the template context.
    pub fn set_special_tokens(&mut self, tok: &Tokenizer) {
        let v = tok.vocab();
        for (name, id) in [
            ("bos_token", v.bos),
            ("eos_token", v.eos),
            ("pad_token", v.pad),
        ] {
            if let Some(s) = id.and_then(|id| tok.token_str(id)) {
                self.specials.insert(name.into(), Json::String(s.into()));
            }
        }
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation given as OpenAI-style JSON.
    ///
    /// `messages`: an array of `{role, content, ...}`; `tools`: an array of tool schemas or `None`;
    /// `extra`: more template variables (`current_date`, `reasoning_strength`, ...).
    /// A tool call's `function.arguments` may be the OpenAI JSON string: it is parsed into the object
    /// the template needs (transformers would raise on a string, llama.cpp parses it too).
    pub fn render(
        &self,
        messages: &Json,
        tools: Option<&Json>,
        add_generation_prompt: bool,
        extra: Option<&Map<String, Json>>,
    ) -> Result<String> {
        let messages = prepare_messages(messages)?;
        let tools = match tools {
            None | Some(Json::Null) => Json::Null,
            Some(t @ Json::Array(_)) => t.clone(),
            Some(other) => {
                return Err(TextError::InvalidChat(format!(
                    "tools must be an array, found {}",
                    kind(other)
                )));
            }
        };
        let mut ctx = self.specials.clone();
        for (k, v) in extra.into_iter().flatten() {
            if matches!(
                k.as_str(),
                "messages" | "tools" | "documents" | "add_generation_prompt"
            ) {
                return Err(TextError::InvalidChat(format!(
                    "template variable '{k}' cannot be overridden"
                )));
            }
            ctx.insert(k.clone(), v.clone());
        }
        ctx.insert("messages".into(), messages);
        ctx.insert("tools".into(), tools);
        ctx.insert("documents".into(), Json::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(add_generation_prompt),
        );
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| template_error(&e, &self.source, &self.origin))?;
        tmpl.render(Value::from(Serde(&ctx)))
            .map_err(|e| template_error(&e, &self.source, &self.origin))
    }

    /// Renders and tokenizes so that control tokens written in any user-supplied string (messages,
    /// tools, `extra`) are encoded as plain text, while the template's own are special tokens: the
    /// ids of transformers' `apply_chat_template(..., tokenize=True, sanitize_control_tokens=True)`.
    /// A server should build prompts with this; plain `render` + `encode(.., parse_special=true)`
    /// lets a user write `<|eot|><|start|>system<|message|>` into a message and be obeyed. An
    /// object key (a schema's property name) that holds a control token is refused: keys cannot
    /// be marked, and transformers would encode it as the token.
    pub fn encode_sanitized(
        &self,
        tok: &Tokenizer,
        messages: &Json,
        tools: Option<&Json>,
        add_generation_prompt: bool,
        extra: Option<&Map<String, Json>>,
    ) -> Result<Vec<u32>> {
        self.encode_sanitized_then(tok, messages, tools, add_generation_prompt, extra, None)
    }

    /// As [`encode_sanitized`](Self::encode_sanitized), the rendered prompt continued by `tail`:
    /// the text it must end with (the format the tail continues: a template that does not end
    /// so is refused), and pieces appended after it, each the user's (its control tokens stay
    /// text, as in messages) or the format's own. A final assistant message is continued so
    /// (llama.cpp's `continue_final_message`: the conversation before it, then its reasoning or
    /// answer opened and left open).
    pub fn encode_sanitized_then(
        &self,
        tok: &Tokenizer,
        messages: &Json,
        tools: Option<&Json>,
        add_generation_prompt: bool,
        extra: Option<&Map<String, Json>>,
        tail: Option<(&str, &[(&str, bool)])>,
    ) -> Result<Vec<u32>> {
        // Built once for the tokenizer a server uses; another tokenizer gets its own each time.
        let mut own = None;
        let san = match self.sanitizer.get() {
            Some((i, s)) if *i == tok.instance() => s,
            Some(_) => own.insert(sanitize::Sanitizer::new(tok, &self.source)?),
            None => {
                let s = sanitize::Sanitizer::new(tok, &self.source)?;
                match self.sanitizer.set((tok.instance(), s)) {
                    Err((_, s)) => own.insert(s),
                    Ok(()) => match self.sanitizer.get() {
                        Some((_, s)) => s,
                        None => own.insert(sanitize::Sanitizer::new(tok, &self.source)?),
                    },
                }
            }
        };
        let controls = san.controls();
        let mut messages = messages.clone();
        sanitize::mark(&mut messages, controls)?;
        let mut tools = tools.cloned();
        if let Some(t) = tools.as_mut() {
            sanitize::mark(t, controls)?;
        }
        let mut extra = extra.cloned().map(Json::Object);
        if let Some(e) = extra.as_mut() {
            sanitize::mark(e, controls)?;
        }
        let mut text = self.render(
            &messages,
            tools.as_ref(),
            add_generation_prompt,
            extra.as_ref().and_then(Json::as_object),
        )?;
        if let Some((end, pieces)) = tail {
            if !text.ends_with(end) {
                let from = text.char_indices().rev().nth(23).map_or(0, |(i, _)| i);
                return Err(TextError::InvalidChat(format!(
                    "the message cannot be continued: it needs a prompt that ends with {end:?} (Muse Glimmer's chat format); this chat template's ends with {:?}",
                    &text[from..]
                )));
            }
            for (piece, user) in pieces {
                if *user {
                    text.push_str(&sanitize::mark_str(piece, controls));
                } else {
                    text.push_str(piece);
                }
            }
        }
        sanitize::encode_marked(tok, san, &text)
    }

    /// Whether this template's prompt for a conversation ends with `end` (the generation prompt
    /// of a chat format: Muse Glimmer's `<|start|>assistant`), as it renders one user message.
    pub fn prompt_ends_with(&self, end: &str) -> bool {
        let ask = || {
            let one = serde_json::json!([{"role": "user", "content": "x"}]);
            self.render(&one, None, true, None)
                .is_ok_and(|t| t.ends_with(end))
        };
        let (e, known) = self.ends_with.get_or_init(|| (end.to_string(), ask()));
        if e == end { *known } else { ask() }
    }

    /// [`render`](Self::render) for typed messages and tools.
    pub fn render_messages(
        &self,
        messages: &[Message],
        tools: &[Tool],
        add_generation_prompt: bool,
        extra: Option<&Map<String, Json>>,
    ) -> Result<String> {
        let m =
            serde_json::to_value(messages).map_err(|e| TextError::InvalidChat(e.to_string()))?;
        let t = serde_json::to_value(tools).map_err(|e| TextError::InvalidChat(e.to_string()))?;
        self.render(
            &m,
            if tools.is_empty() { None } else { Some(&t) },
            add_generation_prompt,
            extra,
        )
    }
}

/// HF's message preprocessing, plus the checks that turn silent template behaviour into errors.
fn prepare_messages(messages: &Json) -> Result<Json> {
    let list = messages.as_array().ok_or_else(|| {
        TextError::InvalidChat(format!(
            "messages must be an array, found {}",
            kind(messages)
        ))
    })?;
    if list.is_empty() {
        return Err(TextError::InvalidChat(
            "the conversation is empty: give at least one message".into(),
        ));
    }
    let has_system = list
        .iter()
        .any(|m| m.get("role").and_then(Json::as_str) == Some("system"));
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let obj = m.as_object().ok_or_else(|| {
            TextError::InvalidChat(format!("message {i} must be an object, found {}", kind(m)))
        })?;
        let role = obj
            .get("role")
            .and_then(Json::as_str)
            .ok_or_else(|| TextError::InvalidChat(format!("message {i} has no string 'role'")))?;
        if !KNOWN_ROLES.contains(&role) {
            return Err(TextError::InvalidChat(format!(
                "message {i} has unknown role '{role}'; expected one of {}",
                KNOWN_ROLES.join(", ")
            )));
        }
        // _normalize_chat_messages: None-valued keys are dropped.
        let mut msg: Map<String, Json> = obj
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        // _alias_reasoning_fields: {"thinking": r, **message, "reasoning_content": r}.
        if let Some(r) = ["reasoning_content", "thinking", "reasoning"]
            .iter()
            .find_map(|k| msg.get(*k).cloned())
        {
            let mut aliased = Map::new();
            aliased.insert("thinking".into(), r.clone());
            aliased.extend(msg);
            aliased.insert("reasoning_content".into(), r);
            msg = aliased;
        }
        // OpenAI's `developer` role is its new name for the system prompt; the template only
        // knows `system` (it would drop the message). With a system message beside it, which of
        // the two is the prompt is the caller's to say.
        if role == "developer" {
            if has_system {
                return Err(TextError::InvalidChat(format!(
                    "message {i} has role 'developer' beside a 'system' message; the template has one system prompt: give one of them"
                )));
            }
            msg.insert("role".into(), Json::String("system".into()));
        }
        if let Some(Json::Array(calls)) = msg.get_mut("tool_calls") {
            for (j, call) in calls.iter_mut().enumerate() {
                parse_arguments(call).map_err(|e| {
                    TextError::InvalidChat(format!("message {i}, tool call {j}: {e}"))
                })?;
            }
        }
        out.push(Json::Object(msg));
    }
    Ok(Json::Array(out))
}

/// `function.arguments` given as a JSON string (OpenAI) becomes the object templates iterate.
fn parse_arguments(call: &mut Json) -> std::result::Result<(), String> {
    let Some(args) = call
        .get_mut("function")
        .and_then(|f| f.get_mut("arguments"))
    else {
        return Ok(());
    };
    if let Json::String(s) = args {
        // Anything but a JSON object is left for the template to judge (Muse Glimmer's raises).
        if let Ok(v @ Json::Object(_)) = serde_json::from_str::<Json>(s) {
            *args = v;
        }
    }
    Ok(())
}

fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

/// A minijinja error as one message naming the template line and quoting it.
fn template_error(e: &Error, source: &str, origin: &str) -> TextError {
    let what = match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    };
    match e.line() {
        Some(n) => {
            let text = source.lines().nth(n.saturating_sub(1)).unwrap_or("").trim();
            let text: String = text.chars().take(160).collect();
            TextError::Template(format!("{origin}, line {n}: {what}\n    {n} | {text}"))
        }
        None => TextError::Template(format!("{origin}: {what}")),
    }
}

/// `{{ x }}` as Python's `str(x)`: floats in repr form (`1e-05`), None as "None"... except that
/// jinja2 prints None as "None" too, and minijinja prints "none"; both are fixed here.
fn python_formatter(
    out: &mut minijinja::Output,
    state: &mut State,
    value: &Value,
) -> std::result::Result<(), Error> {
    let s = if value.is_none() {
        Some("None".to_string())
    } else if value.kind() == minijinja::value::ValueKind::Bool {
        Some(if value.is_true() { "True" } else { "False" }.to_string())
    } else if value.kind() == minijinja::value::ValueKind::Number && !value.is_integer() {
        f64::try_from(value.clone()).ok().map(pyjson::float_repr)
    } else {
        None
    };
    match s {
        Some(s) => std::fmt::Write::write_str(out, &s)
            .map_err(|_| Error::new(ErrorKind::WriteFailure, "write failed")),
        None => minijinja::escape_formatter(out, state, value),
    }
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<String, Error> {
    let mut opts = DumpOptions {
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        ..DumpOptions::default()
    };
    let indent: Option<Value> = kwargs.get("indent")?;
    if let Some(ind) = indent.filter(|v| !v.is_none()) {
        opts.indent = Some(match ind.as_str() {
            Some(s) => s.to_string(),
            None => " ".repeat(usize::try_from(ind.clone()).unwrap_or(0)),
        });
        // json.dumps: with an indent the default item separator loses its space.
        opts.item_sep = ",".into();
    }
    if let Some(seps) = kwargs
        .get::<Option<Value>>("separators")?
        .filter(|v| !v.is_none())
    {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        if let [a, b] = parts.as_slice() {
            opts.item_sep = a.as_str().unwrap_or(",").to_string();
            opts.key_sep = b.as_str().unwrap_or(":").to_string();
        } else {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair of strings",
            ));
        }
    }
    opts.sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    pyjson::dumps(&value, &opts)
}

fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `datetime.now().strftime(fmt)`, in UTC (transformers uses local time; our machines run in UTC).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(&format, secs as i64)
}

pub(crate) fn strftime(format: &str, unix: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out += &y.to_string(),
            Some('y') => out += &format!("{:02}", y.rem_euclid(100)),
            Some('m') => out += &format!("{m:02}"),
            Some('d') => out += &format!("{d:02}"),
            Some('e') => out += &format!("{d:>2}"),
            Some('H') => out += &format!("{hh:02}"),
            Some('I') => out += &format!("{:02}", (hh + 11) % 12 + 1),
            Some('p') => out += if hh < 12 { "AM" } else { "PM" },
            Some('M') => out += &format!("{mm:02}"),
            Some('S') => out += &format!("{ss:02}"),
            Some('j') => out += &format!("{yday:03}"),
            Some('B') => out += MONTHS[(m - 1) as usize],
            Some('b') => out += &MONTHS[(m - 1) as usize][..3],
            Some('A') => out += DAYS[weekday],
            Some('a') => out += &DAYS[weekday][..3],
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 to (year, month, day).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_like_python() {
        // 2026-08-15 13:04:05 UTC, a Saturday.
        let t = 1_786_799_045;
        assert_eq!(strftime("%Y-%m-%d", t), "2026-08-15");
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %A %j %I%p %%", t),
            "15 Aug 2026 13:04:05 Saturday 227 01PM %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
        assert_eq!(strftime("%Y-%m-%d", 951_782_400), "2000-02-29");
    }

    #[test]
    fn python_printing_of_values() {
        let t = ChatTemplate::new(
            "{{ a }} {{ b }} {{ c }} {{ d }} {{ e | tojson }} {{ e | tojson(indent=2) }}",
            "t",
        )
        .unwrap();
        let m = serde_json::json!([{"role": "user", "content": "x"}]);
        let extra =
            serde_json::json!({"a": 1e-5, "b": 2.0, "c": null, "d": true, "e": {"k": [1, "<&>"]}});
        let out = t.render(&m, None, false, extra.as_object()).unwrap();
        assert_eq!(
            out,
            "1e-05 2.0 None True {\"k\": [1, \"<&>\"]} {\n  \"k\": [\n    1,\n    \"<&>\"\n  ]\n}"
        );
    }
}
