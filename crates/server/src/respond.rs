//! Engine events to OpenAI responses: whole JSON bodies, or SSE chunks ending in `data: [DONE]`.
//!
//! Chat text goes through the ATEM parser (reasoning, answer, tool calls); a tool call is
//! streamed as one `tool_calls` delta when its closing tag arrives (ATEM is only known to be
//! well-formed then). Completions text is passed through as it comes.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use muser_text::{AtemStream, ChatDelta, ParsedMessage, StreamDecoder, Tokenizer, ToolCallParser};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use crate::engine::{EchoToken, Event, Finish, TokenLogprob};
use crate::error::ApiError;
use crate::openai::Endpoint;

/// What every chunk and body of one response repeats.
#[derive(Clone, Debug)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
    /// Choices in the response (prompts x n).
    pub choices: usize,
    /// Choices per prompt: prompt tokens are counted once per prompt.
    pub n: usize,
    pub include_usage: bool,
    /// A chat request's stop strings (None: none, or a completions request, whose stops the
    /// engine matches in the text itself).
    pub chat_stops: Option<ChatStops>,
}

impl Meta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!(self.object(chunk)));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m.insert("system_fingerprint".into(), Value::Null);
        m.insert("choices".into(), choices);
        if chunk && self.include_usage {
            m.insert("usage".into(), Value::Null);
        }
        m
    }
}

/// OpenAI's usage object; `cached`: prompt tokens found in a kept cache (prefix reuse).
fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// A token's text for logprobs: what it decodes to, special tokens included; a token whose
/// bytes are not whole UTF-8 (a piece of a character) as OpenAI writes it, "bytes:\\xe2\\x80",
/// so that such tokens keep distinct names instead of all reading "\u{fffd}".
fn token_text(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let b = tok.piece(id, false).map(<[u8]>::to_vec).unwrap_or_default();
    let s = match std::str::from_utf8(&b) {
        Ok(s) => s.to_string(),
        Err(_) => {
            let mut s = String::from("bytes:");
            for x in &b {
                s.push_str(&format!("\\x{x:02x}"));
            }
            s
        }
    };
    (s, b)
}

/// Chat's `logprobs.content[i]`.
fn chat_logprob(tok: &Tokenizer, id: u32, lp: &TokenLogprob) -> Value {
    let (s, b) = token_text(tok, id);
    let top: Vec<Value> = lp
        .top
        .iter()
        .map(|&(t, l)| {
            let (s, b) = token_text(tok, t);
            json!({"token": s, "logprob": l, "bytes": b})
        })
        .collect();
    json!({"token": s, "logprob": lp.logprob, "bytes": b, "top_logprobs": top})
}

/// A chat choice's `logprobs.content`: the entries of the tokens whose text became the answer
/// (OpenAI's content tokens), not those of reasoning, tool calls or protocol markup. A token's
/// entry comes out once the choice's ATEM parser is done with its text
/// (`AtemStream::consumed`), kept if any of its bytes were released as content
/// (`take_content_spans`). A token whose text is empty (bytes of a character still incomplete)
/// goes with the next one's text.
#[derive(Default)]
struct ContentLogprobs {
    /// (first byte, end byte, entry, became content) per token not yet resolved.
    pending: std::collections::VecDeque<(usize, usize, Value, bool)>,
    /// Bytes of text taken so far (the parser's offsets).
    pushed: usize,
    /// Entries resolved and kept, not yet taken (`ChatChoice::take_logprobs`).
    done: Vec<Value>,
}

impl ContentLogprobs {
    /// One token's text and its entry (None: none asked), before the parser takes the text.
    fn add(&mut self, text: &str, entry: Option<Value>) {
        let start = self.pushed;
        self.pushed += text.len();
        if !text.is_empty() {
            for p in self.pending.iter_mut().rev() {
                if p.1 != start || p.0 != start {
                    break;
                }
                p.1 = self.pushed;
            }
        }
        if let Some(e) = entry {
            self.pending.push_back((start, self.pushed, e, false));
        }
    }

    /// After the parser took the text: the entries it is done with, kept if content; with
    /// `all` (the end of the text) every one left.
    fn resolve(&mut self, atem: &mut AtemStream, all: bool) {
        for (a, b) in atem.take_content_spans() {
            for p in self.pending.iter_mut() {
                p.3 |= p.0 < b && a < p.1;
            }
        }
        let consumed = atem.consumed();
        while let Some(p) = self.pending.front() {
            if !all && !(p.1 <= consumed && p.0 < p.1) {
                break;
            }
            if let Some(p) = self.pending.pop_front()
                && p.3
            {
                self.done.push(p.2);
            }
        }
    }
}

/// Completions' logprobs: parallel lists.
#[derive(Default)]
struct CompletionLogprobs {
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<Value>,
}

impl CompletionLogprobs {
    fn push(&mut self, tok: &Tokenizer, id: u32, lp: &TokenLogprob, offset: usize) {
        self.tokens.push(json!(token_text(tok, id).0));
        self.token_logprobs.push(json!(lp.logprob));
        // Most likely first: where two tokens read the same, the map keeps the likelier one.
        let mut top = Map::new();
        for &(t, l) in &lp.top {
            top.entry(token_text(tok, t).0).or_insert(json!(l));
        }
        self.top_logprobs.push(Value::Object(top));
        self.text_offset.push(json!(offset));
    }

    /// An echoed prompt's token: its log-probability if it has one (the first has none: null).
    fn push_echo(&mut self, tok: &Tokenizer, t: &EchoToken, offset: usize) {
        match &t.logprob {
            Some(lp) => self.push(tok, t.id, lp, offset),
            None => {
                self.tokens.push(json!(token_text(tok, t.id).0));
                self.token_logprobs.push(Value::Null);
                self.top_logprobs.push(Value::Null);
                self.text_offset.push(json!(offset));
            }
        }
    }

    fn json(self) -> Value {
        json!({"tokens": self.tokens, "token_logprobs": self.token_logprobs,
               "top_logprobs": self.top_logprobs, "text_offset": self.text_offset})
    }
}

/// A chat request's stop strings. They are matched in the answer's text only: the model's
/// output also carries its reasoning, the protocol's headers and tool calls, where a stop string
/// ("\n", ".") would end the turn before any answer. The engine's own matching sees that raw
/// text, so chat sequences go to it without stops; a choice whose answer meets one sets its flag,
/// and the engine ends it before its next step (`Job::stop_flags`).
#[derive(Clone, Debug)]
pub struct ChatStops {
    pub stops: Vec<String>,
    /// One per choice.
    pub flags: Arc<[AtomicBool]>,
}

impl ChatStops {
    pub fn new(stops: Vec<String>, choices: usize) -> Self {
        ChatStops {
            stops,
            flags: (0..choices).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    fn stop(&self, index: usize) {
        if let Some(f) = self.flags.get(index) {
            f.store(true, Ordering::Relaxed);
        }
    }
}

/// How a chat's answers are read: the tools offered (ATEM calls), and whether the answer is
/// JSON by a response format (`Constrain::Schema`), which may come fenced.
#[derive(Default)]
pub struct ChatParser {
    pub tools: ToolCallParser,
    pub json_answer: bool,
    /// A final assistant message the answer continues: its text after the generation prompt
    /// (`openai::Continued::pieces`: the format's markup, and the user's text, which is not
    /// read as markup) is read before the generated text, so the message holds it, as llama.cpp
    /// parses its generation prompt and the output as one.
    pub continued: Option<crate::openai::Continued>,
}

/// The ```` ```json ```` fence a JSON answer may come in (the response format's grammar allows
/// it, with white space inside), taken off the content as llama.cpp's parser leaves it out of the
/// message (common/parsers/muse-glimmer.cpp: only the JSON is `content`). The fence's opening
/// is known in the content's first bytes; a possible closing (white space, then up to three
/// backticks, at the very end) is held back until more text or the end decides.
#[derive(Default)]
struct FenceStrip {
    state: Fence,
    held: String,
}

#[derive(Default, PartialEq)]
enum Fence {
    /// Nothing decided yet: `held` is a prefix of the opening.
    #[default]
    Start,
    /// After the opening: its white space is skipped.
    Open,
    /// The fenced JSON.
    Body,
    /// Not fenced.
    Plain,
}

const FENCE_OPEN: &str = "```json";

impl FenceStrip {
    fn push(&mut self, s: &str) -> String {
        match self.state {
            Fence::Plain => s.to_string(),
            Fence::Start => {
                self.held.push_str(s);
                if FENCE_OPEN.starts_with(self.held.as_str()) {
                    return String::new();
                }
                let held = std::mem::take(&mut self.held);
                match held.strip_prefix(FENCE_OPEN) {
                    Some(rest) => {
                        self.state = Fence::Open;
                        self.push(rest)
                    }
                    None => {
                        self.state = Fence::Plain;
                        held
                    }
                }
            }
            Fence::Open => {
                let rest = s.trim_start_matches([' ', '\t', '\n']);
                if rest.is_empty() {
                    return String::new();
                }
                self.state = Fence::Body;
                self.push(rest)
            }
            Fence::Body => {
                self.held.push_str(s);
                // The longest suffix that may yet be the closing: white space, then backticks.
                let b = self.held.as_bytes();
                let mut k = b.len();
                let mut ticks = 0;
                while k > 0 && b[k - 1] == b'`' && ticks < 3 {
                    k -= 1;
                    ticks += 1;
                }
                while k > 0 && matches!(b[k - 1], b' ' | b'\t' | b'\n') {
                    k -= 1;
                }
                let tail = self.held.split_off(k);
                std::mem::replace(&mut self.held, tail)
            }
        }
    }

    /// The end of the answer: a held closing is dropped where the answer is whole (the grammar
    /// ended it: those backticks close the fence), anything else held released (an answer cut
    /// at max_tokens may end in backticks of its own).
    fn finish(&mut self, whole: bool) -> String {
        let held = std::mem::take(&mut self.held);
        match self.state {
            Fence::Body if whole && held.trim_start_matches([' ', '\t', '\n']) == "```" => {
                String::new()
            }
            _ => held,
        }
    }
}

/// One chat choice being built: the ATEM parser over its text, and its logprobs.
pub struct ChatChoice {
    atem: AtemStream,
    /// A JSON answer's fence, taken off its content (`ChatParser::json_answer`).
    fence: Option<FenceStrip>,
    logprobs: ContentLogprobs,
    tool_calls: usize,
    started: bool,
    /// The answer's stop strings (their matcher holds back a possible start of one), and
    /// whether one was met: then nothing more of this choice is shown.
    stops: Option<StreamDecoder>,
    stopped: bool,
    /// Tokens taken in (`push`): once a stop string is met, the choice's completion tokens
    /// (the engine may make a few more before it sees the flag; they are not the answer's).
    tokens: usize,
    /// What the deltas so far add up to.
    msg: ParsedMessage,
    /// The continued message's delta, not yet sent (a stream sends it before the first token's).
    continued: Option<Value>,
}

impl ChatChoice {
    pub fn new(parser: &ToolCallParser) -> Self {
        ChatChoice {
            atem: parser.stream(),
            fence: None,
            logprobs: ContentLogprobs::default(),
            tool_calls: 0,
            started: false,
            stops: None,
            stopped: false,
            tokens: 0,
            msg: ParsedMessage::default(),
            continued: None,
        }
    }

    /// As `new`, the answer ending before the first of `stops` it meets.
    pub fn with_stops(parser: &ToolCallParser, stops: &[String]) -> Self {
        let mut c = Self::new(parser);
        if !stops.is_empty() {
            c.stops = Some(StreamDecoder::new(false, stops.iter().cloned()));
        }
        c
    }

    /// For `parser`'s chat: its tools, its stops, a JSON answer's fence taken off, the message
    /// it continues read first (not matched against the stops, which are the output's).
    pub fn for_chat(parser: &ChatParser, stops: &[String]) -> Self {
        let mut c = Self::with_stops(&parser.tools, stops);
        if parser.json_answer {
            c.fence = Some(FenceStrip::default());
        }
        if let Some(cont) = &parser.continued {
            let mut d = Vec::new();
            for (text, user) in cont.pieces() {
                c.logprobs.add(text, None);
                d.extend(if user {
                    c.atem.push_text(text)
                } else {
                    c.atem.push(text)
                });
            }
            c.logprobs.resolve(&mut c.atem, false);
            let stops = c.stops.take();
            c.continued = c.delta(d, None);
            c.stops = stops;
        }
        c
    }

    /// The deltas a stream opens the choice with, once: the role, then the continued
    /// message's text (`for_chat`), if any.
    fn opening(&mut self) -> Vec<Value> {
        if self.started {
            return Vec::new();
        }
        self.started = true;
        let mut v = vec![json!({"role": "assistant", "content": ""})];
        v.extend(self.continued.take());
        v
    }

    /// Whether the answer met a stop string.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The choice's completion tokens: the engine's count, or, once a stop string was met,
    /// the tokens up to the one that completed it.
    pub fn completion_tokens(&self, engine: usize) -> usize {
        if self.stopped { self.tokens } else { engine }
    }

    /// The message the deltas so far make (the answer cut at a stop string).
    pub fn message(&self) -> &ParsedMessage {
        &self.msg
    }

    /// The delta object of some parser output (None if it holds nothing). `finishing`: the
    /// last output, so the stop matcher releases what it held; whether the answer is whole.
    fn delta(&mut self, mut deltas: Vec<ChatDelta>, finishing: Option<bool>) -> Option<Value> {
        if let Some(f) = &mut self.fence {
            for d in &mut deltas {
                if let ChatDelta::Content(s) = d {
                    *s = f.push(s);
                }
            }
            if let Some(whole) = finishing {
                deltas.push(ChatDelta::Content(f.finish(whole)));
            }
        }
        let finishing = finishing.is_some();
        let mut content = String::new();
        let mut reasoning = String::new();
        let mut calls = Vec::new();
        for d in deltas {
            if self.stopped {
                break;
            }
            match d {
                ChatDelta::Content(s) => match &mut self.stops {
                    _ if s.is_empty() => {}
                    Some(m) => {
                        content.push_str(&m.push_bytes(s.as_bytes()));
                        self.stopped = m.stopped().is_some();
                    }
                    None => content.push_str(&s),
                },
                ChatDelta::Reasoning(s) => reasoning.push_str(&s),
                ChatDelta::ToolCall { index, call } => {
                    self.tool_calls += 1;
                    calls.push(json!({
                        "index": index,
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.function.name, "arguments": call.function.arguments},
                    }));
                    self.msg.tool_calls.push(call);
                }
            }
        }
        if finishing
            && !self.stopped
            && let Some(m) = &mut self.stops
        {
            content.push_str(&m.finish());
        }
        self.msg.content.push_str(&content);
        self.msg.reasoning_content.push_str(&reasoning);
        let mut m = Map::new();
        if !content.is_empty() {
            m.insert("content".into(), json!(content));
        }
        if !reasoning.is_empty() {
            m.insert("reasoning_content".into(), json!(reasoning));
        }
        if !calls.is_empty() {
            m.insert("tool_calls".into(), Value::Array(calls));
        }
        (!m.is_empty()).then_some(Value::Object(m))
    }

    /// One token's text, and its logprobs entry if the request asks for them.
    pub fn push(&mut self, text: &str, logprob: Option<Value>) -> Option<Value> {
        self.tokens += 1;
        self.logprobs.add(text, logprob);
        let d = self.atem.push(text);
        self.logprobs.resolve(&mut self.atem, false);
        self.delta(d, None)
    }

    /// The end of the text: what the parser (and the stop matcher) still held. `whole`: the
    /// generation ended itself (an end of generation or a stop), not at max_tokens.
    pub fn finish(&mut self, text: &str, whole: bool) -> Option<Value> {
        self.logprobs.add(text, None);
        let mut d = self.atem.push(text);
        d.extend(self.atem.finish());
        self.logprobs.resolve(&mut self.atem, true);
        self.delta(d, Some(whole))
    }

    /// The logprobs entries of answer tokens resolved since the last call (`ContentLogprobs`).
    pub fn take_logprobs(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.logprobs.done)
    }

    /// The stop string the answer met, if one (vLLM's `stop_reason`).
    pub fn stop_string(&self) -> Option<&str> {
        match self.stops.as_ref()?.stopped()? {
            muser_text::StopReason::StopString(s) => Some(s),
        }
    }

    pub fn finish_reason(&self, f: Finish) -> &'static str {
        if self.tool_calls > 0 {
            "tool_calls"
        } else if self.stopped {
            "stop"
        } else {
            f.as_str()
        }
    }
}

/// Collects every choice and answers with one JSON body.
pub async fn whole(
    meta: Meta,
    rx: mpsc::Receiver<Event>,
    tok: Arc<Tokenizer>,
    parser: Option<ChatParser>,
) -> Response {
    match whole_body(meta, rx, tok, parser).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The OpenAI body `whole` answers with (other APIs' adapters rewrite it).
pub async fn whole_body(
    meta: Meta,
    mut rx: mpsc::Receiver<Event>,
    tok: Arc<Tokenizer>,
    parser: Option<ChatParser>,
) -> Result<Value, ApiError> {
    struct Acc {
        text: String,
        chat: Vec<Value>,
        comp: CompletionLogprobs,
        any_logprobs: bool,
        finish: Option<Finish>,
        completion_tokens: usize,
        prompt_tokens: usize,
        cached_tokens: usize,
    }
    let mut acc: Vec<Acc> = (0..meta.choices)
        .map(|_| Acc {
            text: String::new(),
            chat: Vec::new(),
            comp: CompletionLogprobs::default(),
            any_logprobs: false,
            finish: None,
            completion_tokens: 0,
            prompt_tokens: 0,
            cached_tokens: 0,
        })
        .collect();
    // Each chat choice parsed as it comes: its answer can stop at a stop string, and its
    // logprobs keep the answer's tokens.
    let parser = parser.unwrap_or_default();
    let stops: &[String] = meta.chat_stops.as_ref().map_or(&[], |c| &c.stops);
    let mut cut: Vec<Option<ChatChoice>> = (0..meta.choices)
        .map(|_| (meta.endpoint == Endpoint::Chat).then(|| ChatChoice::for_chat(&parser, stops)))
        .collect();
    let mut left = meta.choices;
    while left > 0 {
        let Some(ev) = rx.recv().await else {
            return Err(ApiError::internal(
                "the engine stopped before the response was complete",
            ));
        };
        match ev {
            Event::Token {
                index,
                id,
                text,
                logprob,
            } => {
                let Some(a) = acc.get_mut(index) else {
                    continue;
                };
                a.any_logprobs |= logprob.is_some();
                if let Some(Some(c)) = cut.get_mut(index) {
                    if c.stopped() {
                        // Tokens the engine made before it saw the stop flag.
                        continue;
                    }
                    c.push(&text, logprob.map(|lp| chat_logprob(&tok, id, &lp)));
                    a.chat.extend(c.take_logprobs());
                    if c.stopped()
                        && let Some(cs) = &meta.chat_stops
                    {
                        cs.stop(index);
                    }
                } else if let Some(lp) = &logprob {
                    a.comp.push(&tok, id, lp, a.text.chars().count());
                }
                a.text.push_str(&text);
            }
            Event::Done {
                index,
                finish,
                text,
                prompt_tokens,
                cached_tokens,
                completion_tokens,
            } => {
                let Some(a) = acc.get_mut(index) else {
                    continue;
                };
                a.completion_tokens = completion_tokens;
                if let Some(Some(c)) = cut.get_mut(index) {
                    c.finish(&text, finish == Finish::Stop);
                    a.completion_tokens = c.completion_tokens(completion_tokens);
                    a.chat.extend(c.take_logprobs());
                }
                a.text.push_str(&text);
                a.finish = Some(finish);
                a.prompt_tokens = prompt_tokens;
                a.cached_tokens = cached_tokens;
                left -= 1;
            }
            Event::Echo {
                index,
                tokens,
                logprobs,
            } => {
                let Some(a) = acc.get_mut(index) else {
                    continue;
                };
                a.any_logprobs |= logprobs;
                for t in &tokens {
                    if logprobs {
                        a.comp.push_echo(&tok, t, a.text.chars().count());
                    }
                    a.text.push_str(&t.text);
                }
            }
            Event::Error { error, .. } => return Err(error),
        }
    }
    // Once per prompt (its first choice), as the stream counts them.
    let (prompt_tokens, cached_tokens) =
        acc.iter().step_by(meta.n.max(1)).fold((0, 0), |(p, c), a| {
            (p + a.prompt_tokens, c + a.cached_tokens)
        });
    let completion_tokens: usize = acc.iter().map(|a| a.completion_tokens).sum();
    let choices: Vec<Value> = acc
        .into_iter()
        .zip(cut)
        .enumerate()
        .map(|(i, (a, cut))| {
            let finish = a.finish.unwrap_or(Finish::Stop);
            // A chat choice has its parser (`cut`); a completion has none.
            match cut {
                Some(c) => {
                    let reason = c.finish_reason(finish);
                    let msg = serde_json::to_value(c.message().clone().into_message())
                        .unwrap_or(Value::Null);
                    let logprobs = if a.any_logprobs {
                        json!({"content": a.chat})
                    } else {
                        Value::Null
                    };
                    json!({"index": i, "message": msg, "logprobs": logprobs, "finish_reason": reason,
                        "stop_reason": c.stop_string()})
                }
                None => {
                    let logprobs = if a.any_logprobs {
                        a.comp.json()
                    } else {
                        Value::Null
                    };
                    json!({"index": i, "text": a.text, "logprobs": logprobs, "finish_reason": finish.as_str()})
                }
            }
        })
        .collect();
    let mut body = meta.envelope(false, Value::Array(choices));
    body.insert(
        "usage".into(),
        usage(prompt_tokens, completion_tokens, cached_tokens),
    );
    Ok(Value::Object(body))
}

/// A chat chunk's body holding `delta` alone (no logprobs, no finish).
fn plain_delta(delta: Value) -> Map<String, Value> {
    let mut b = Map::new();
    b.insert("delta".into(), delta);
    b.insert("logprobs".into(), Value::Null);
    b.insert("finish_reason".into(), Value::Null);
    b
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

/// Streams the choices as SSE chunks, then `[DONE]`. Dropping the stream (the client went
/// away) drops `rx`, which cancels the request in the engine.
pub fn stream(
    meta: Meta,
    rx: mpsc::Receiver<Event>,
    tok: Arc<Tokenizer>,
    parser: Option<ChatParser>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let chunks = chunks(meta, rx, tok, parser);
    let s = async_stream::stream! {
        futures_util::pin_mut!(chunks);
        while let Some(c) = chunks.next().await {
            yield Ok(match c {
                Ok(v) => data(&v),
                Err(e) => data(&e.body()),
            });
        }
        yield Ok(SseEvent::default().data("[DONE]"));
    };
    Sse::new(s).keep_alive(KeepAlive::default())
}

/// The OpenAI chunks `stream` sends, as values (other APIs' adapters rewrite them); a failure
/// is the last item.
pub fn chunks(
    meta: Meta,
    mut rx: mpsc::Receiver<Event>,
    tok: Arc<Tokenizer>,
    parser: Option<ChatParser>,
) -> impl Stream<Item = Result<Value, ApiError>> {
    async_stream::stream! {
        let parser = parser.unwrap_or_default();
        let stops: &[String] = meta.chat_stops.as_ref().map_or(&[], |c| &c.stops);
        let mut chat: Vec<ChatChoice> = (0..meta.choices).map(|_| ChatChoice::for_chat(&parser, stops)).collect();
        let mut offsets = vec![0usize; meta.choices];
        let mut prompt_tokens = 0;
        let mut cached_tokens = 0;
        let mut completion_tokens = 0;
        let mut left = meta.choices;
        let mut failed = false;
        let chunk = |index: usize, body: Map<String, Value>| {
            let mut c = body;
            c.insert("index".into(), json!(index));
            meta.envelope(true, Value::Array(vec![Value::Object(c)]))
        };
        while left > 0 {
            let Some(ev) = rx.recv().await else {
                yield Err(ApiError::internal("the engine stopped during the response"));
                failed = true;
                break;
            };
            match ev {
                Event::Token { index, id, text, logprob } => {
                    let Some(c) = chat.get_mut(index) else { continue };
                    match meta.endpoint {
                        Endpoint::Chat => {
                            if c.stopped() {
                                // Tokens the engine made before it saw the stop flag.
                                continue;
                            }
                            for d in c.opening() {
                                yield Ok(Value::Object(chunk(index, plain_delta(d))));
                            }
                            let delta = c.push(&text, logprob.map(|l| chat_logprob(&tok, id, &l)));
                            if c.stopped()
                                && let Some(cs) = &meta.chat_stops {
                                    cs.stop(index);
                                }
                            let done = c.take_logprobs();
                            let lp = (!done.is_empty()).then(|| json!({"content": done}));
                            if delta.is_some() || lp.is_some() {
                                let mut b = Map::new();
                                b.insert("delta".into(), delta.unwrap_or_else(|| json!({})));
                                b.insert("logprobs".into(), lp.unwrap_or(Value::Null));
                                b.insert("finish_reason".into(), Value::Null);
                                yield Ok(Value::Object(chunk(index, b)));
                            }
                        }
                        Endpoint::Completions => {
                            let lp = logprob.map(|l| {
                                let mut c = CompletionLogprobs::default();
                                c.push(&tok, id, &l, offsets[index]);
                                c.json()
                            });
                            offsets[index] += text.chars().count();
                            if !text.is_empty() || lp.is_some() {
                                let mut b = Map::new();
                                b.insert("text".into(), json!(text));
                                b.insert("logprobs".into(), lp.unwrap_or(Value::Null));
                                b.insert("finish_reason".into(), Value::Null);
                                yield Ok(Value::Object(chunk(index, b)));
                            }
                        }
                    }
                }
                Event::Done { index, finish, text, prompt_tokens: p, cached_tokens: k, completion_tokens: n } => {
                    let Some(c) = chat.get_mut(index) else { continue };
                    left -= 1;
                    if index % meta.n.max(1) == 0 {
                        prompt_tokens += p;
                        cached_tokens += k;
                    }
                    completion_tokens += match meta.endpoint {
                        Endpoint::Chat => c.completion_tokens(n),
                        Endpoint::Completions => n,
                    };
                    let mut b = Map::new();
                    match meta.endpoint {
                        Endpoint::Chat => {
                            // A continued message's text comes before the last delta, after the
                            // role; without one, the last delta carries the role.
                            if c.continued.is_some() {
                                for d in c.opening() {
                                    yield Ok(Value::Object(chunk(index, plain_delta(d))));
                                }
                            }
                            let mut delta = c.finish(&text, finish == Finish::Stop).unwrap_or_else(|| json!({}));
                            if !c.started
                                && let Some(d) = delta.as_object_mut() {
                                    d.insert("role".into(), json!("assistant"));
                                }
                            let done = c.take_logprobs();
                            b.insert("delta".into(), delta);
                            b.insert("logprobs".into(), if done.is_empty() { Value::Null } else { json!({"content": done}) });
                            b.insert("finish_reason".into(), json!(c.finish_reason(finish)));
                            b.insert("stop_reason".into(), json!(c.stop_string()));
                        }
                        Endpoint::Completions => {
                            b.insert("text".into(), json!(text));
                            b.insert("logprobs".into(), Value::Null);
                            b.insert("finish_reason".into(), json!(finish.as_str()));
                        }
                    }
                    yield Ok(Value::Object(chunk(index, b)));
                }
                Event::Echo { index, tokens, logprobs } => {
                    let Some(off) = offsets.get_mut(index) else { continue };
                    let mut c = CompletionLogprobs::default();
                    let mut text = String::new();
                    for t in &tokens {
                        if logprobs {
                            c.push_echo(&tok, t, *off);
                        }
                        *off += t.text.chars().count();
                        text.push_str(&t.text);
                    }
                    let mut b = Map::new();
                    b.insert("text".into(), json!(text));
                    b.insert("logprobs".into(), if logprobs { c.json() } else { Value::Null });
                    b.insert("finish_reason".into(), Value::Null);
                    yield Ok(Value::Object(chunk(index, b)));
                }
                Event::Error { error, .. } => {
                    yield Err(error);
                    failed = true;
                    break;
                }
            }
        }
        if meta.include_usage && !failed {
            let mut m = meta.envelope(true, Value::Array(Vec::new()));
            m.insert("usage".into(), usage(prompt_tokens, completion_tokens, cached_tokens));
            yield Ok(Value::Object(m));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> ToolCallParser {
        let tools = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]);
        ToolCallParser::from_json(Some(&tools)).unwrap()
    }

    /// Canned model text (as the engine streams it, special tokens kept) through the chat
    /// builder: reasoning, then an ATEM tool call, cut into small pieces.
    #[test]
    fn atem_text_streams_reasoning_then_one_tool_call_delta() {
        let text = " to=self<|message|>The user wants weather.<|eom|><|start|>assistant to=get_weather<|message|><atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">Paris</atem:parameter>\n<atem:parameter name=\"days\">3</atem:parameter>\n</atem:invoke>\n</atem:function_calls>";
        let p = weather();
        let mut c = ChatChoice::new(&p);
        let mut deltas = Vec::new();
        let bytes: Vec<char> = text.chars().collect();
        for piece in bytes.chunks(5) {
            let s: String = piece.iter().collect();
            deltas.extend(c.push(&s, None));
        }
        deltas.extend(c.finish("", true));
        let reasoning: String = deltas
            .iter()
            .filter_map(|d| d.get("reasoning_content").and_then(Value::as_str))
            .collect();
        assert_eq!(reasoning, "The user wants weather.");
        let calls: Vec<&Value> = deltas
            .iter()
            .filter_map(|d| d.get("tool_calls"))
            .flat_map(|v| v.as_array().into_iter().flatten())
            .collect();
        assert_eq!(calls.len(), 1, "{deltas:?}");
        assert_eq!(calls[0]["index"], 0);
        assert_eq!(calls[0]["type"], "function");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
        let args: Value =
            serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris", "days": 3}));
        assert!(deltas.iter().all(|d| d.get("content").is_none()));
        assert_eq!(c.finish_reason(Finish::Stop), "tool_calls");
    }

    /// Chat logprobs keep the answer's tokens only: canned tokens (as the engine streams them)
    /// of reasoning, an answer, then a tool call; each token's entry is its own text, so the
    /// kept entries must spell the answer. An empty token (an incomplete character) goes with
    /// the next; a text that is not in the message format is all answer.
    #[test]
    fn chat_logprobs_cover_the_answer_tokens() {
        let run = |p: &ToolCallParser, tokens: &[&str]| -> Vec<String> {
            let mut c = ChatChoice::new(p);
            let mut out = Vec::new();
            for (i, t) in tokens.iter().enumerate() {
                c.push(t, Some(json!(format!("{i}:{t}"))));
                out.extend(c.take_logprobs());
            }
            c.finish("", true);
            out.extend(c.take_logprobs());
            out.iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        };
        let tokens = [
            " to",
            "=self",
            "<|message|>",
            "Think",
            "ing.",
            "<|eom|>",
            "<|start|>assistant",
            "<|message|>",
            "Hel",
            "",
            "lo",
            "!",
            "<|eom|>",
            "<|start|>assistant",
            " to=get_weather",
            "<|message|>",
            "<atem:function_calls>\n<atem:invoke name=\"get_weather\">\n",
            "<atem:parameter name=\"city\">Paris</atem:parameter>\n</atem:invoke>\n</atem:function_calls>",
            "<|eot|>",
        ];
        assert_eq!(run(&weather(), &tokens), ["8:Hel", "9:", "10:lo", "11:!"]);
        // Cut differently: a token holding the end of the answer and a marker's start.
        let tokens = ["<|message|>", "Hi", " there<|e", "ot|>"];
        assert_eq!(run(&weather(), &tokens), ["1:Hi", "2: there<|e"]);
        // Not the message format: every token is answer.
        let tokens = ["Just", " text", " <|"];
        assert_eq!(run(&weather(), &tokens), ["0:Just", "1: text", "2: <|"]);
        // A tool message calling a tool not offered is content, and so are its tokens.
        let tokens = [
            " to=nope",
            "<|message|>",
            "<atem:function_calls>\n<atem:invoke name=\"nope\">\n",
            "</atem:invoke>\n</atem:function_calls>",
            "<|eot|>",
        ];
        assert_eq!(
            run(&weather(), &tokens),
            [
                "2:<atem:function_calls>\n<atem:invoke name=\"nope\">\n",
                "3:</atem:invoke>\n</atem:function_calls>"
            ]
        );
    }

    /// Feeds `text` to a chat choice with `stops` in pieces of `n` characters; returns (content,
    /// reasoning, stopped, finish reason) from the deltas, after checking they add up to the
    /// choice's message.
    fn with_stops(text: &str, stops: &[&str], n: usize) -> (String, String, bool, &'static str) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut c = ChatChoice::with_stops(&weather(), &stops);
        let chars: Vec<char> = text.chars().collect();
        let mut deltas = Vec::new();
        for piece in chars.chunks(n) {
            deltas.extend(c.push(&piece.iter().collect::<String>(), None));
        }
        deltas.extend(c.finish("", true));
        let field = |k: &str| -> String {
            deltas
                .iter()
                .filter_map(|d| d.get(k).and_then(Value::as_str))
                .collect()
        };
        let (content, reasoning) = (field("content"), field("reasoning_content"));
        assert_eq!(content, c.message().content);
        assert_eq!(reasoning, c.message().reasoning_content);
        (
            content,
            reasoning,
            c.stopped(),
            c.finish_reason(Finish::Length),
        )
    }

    /// A JSON answer's fence is not content, whole or streamed however the text is cut; the
    /// white space inside it goes with it; backticks inside the JSON and an answer without a
    /// fence stay; with stop strings, they apply to the JSON.
    #[test]
    fn json_answers_lose_their_fence() {
        let run_as = |text: &str, n: usize, stops: &[&str], whole: bool| -> String {
            let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
            let p = ChatParser {
                tools: ToolCallParser::new(&[]),
                json_answer: true,
                continued: None,
            };
            let mut c = ChatChoice::for_chat(&p, &stops);
            let chars: Vec<char> = text.chars().collect();
            let mut content = String::new();
            let mut take = |d: Option<Value>| {
                if let Some(s) = d
                    .as_ref()
                    .and_then(|d| d.get("content"))
                    .and_then(Value::as_str)
                {
                    content.push_str(s);
                }
            };
            for piece in chars.chunks(n) {
                take(c.push(&piece.iter().collect::<String>(), None));
            }
            take(c.finish("", whole));
            assert_eq!(content, c.message().content);
            content
        };
        let run = |text: &str, n: usize, stops: &[&str]| run_as(text, n, stops, true);
        for n in 1..14 {
            let fenced = " to=self<|message|>hm<|eom|><|start|>assistant to=user<|message|>```json\n  {\"a\": \"``\"}\n\t```";
            assert_eq!(run(fenced, n, &[]), "{\"a\": \"``\"}", "pieces of {n}");
            assert_eq!(
                run("<|message|>```json {\"b\": 1} ```", n, &[]),
                "{\"b\": 1}"
            );
            assert_eq!(
                run("<|message|>{\"b\": \"```\"}", n, &[]),
                "{\"b\": \"```\"}"
            );
            assert_eq!(run("<|message|>[1, 2]", n, &[]), "[1, 2]");
            // Cut off before the closing fence (max_tokens): the JSON so far, backticks of its
            // own included.
            assert_eq!(
                run_as("<|message|>```json\n{\"c\": ", n, &[], false),
                "{\"c\": "
            );
            assert_eq!(
                run_as("<|message|>```json\n{\"a\": \" ```", n, &[], false),
                "{\"a\": \" ```"
            );
            assert_eq!(
                run("<|message|>```json\n{\"c\": 1}\n``", n, &[]),
                "{\"c\": 1}\n``"
            );
            assert_eq!(run("<|message|>```js", n, &[]), "```js");
            assert_eq!(
                run("<|message|>```json\n{\"a\": 1, \"b\": 2}\n```", n, &[", "]),
                "{\"a\": 1"
            );
        }
    }

    /// A chat's stop strings end the answer only: the same string in the reasoning does not stop
    /// it, in the answer it ends it (the stop string not shown), across every way of cutting
    /// the text; a possible start of a stop string that never completes is shown at the end.
    #[test]
    fn chat_stops_end_the_answer_not_the_reasoning() {
        let text = " to=self<|message|>Think: then\nObservation: comes.<|eom|><|start|>assistant to=user<|message|>The answer.\nObservation: tail";
        for n in 1..12 {
            let got = with_stops(text, &["\nObservation:", "never"], n);
            assert_eq!(
                got,
                (
                    "The answer.".into(),
                    "Think: then\nObservation: comes.".into(),
                    true,
                    "stop"
                ),
                "pieces of {n}"
            );
            // No stop met: everything, including a held possible start of one.
            let got = with_stops(" to=user<|message|>Almost \nObserv", &["\nObservation:"], n);
            assert_eq!(
                got,
                ("Almost \nObserv".into(), String::new(), false, "length"),
                "pieces of {n}"
            );
            // Text outside the message format is all answer.
            let got = with_stops("plain text. More", &["."], n);
            assert_eq!(
                got,
                ("plain text".into(), String::new(), true, "stop"),
                "pieces of {n}"
            );
        }
    }

    #[test]
    fn plain_answers_and_unknown_tools_stay_content() {
        let p = weather();
        let mut c = ChatChoice::new(&p);
        let mut out = String::new();
        for s in [" to=user<|message|>Hel", "lo!"] {
            if let Some(d) = c.push(s, None) {
                out += d["content"].as_str().unwrap_or("");
            }
        }
        if let Some(d) = c.finish("", true) {
            out += d["content"].as_str().unwrap_or("");
        }
        assert_eq!(out, "Hello!");
        assert_eq!(c.finish_reason(Finish::Length), "length");

        // A call to a tool that was not offered is content, not a tool call.
        let mut c = ChatChoice::new(&ToolCallParser::default());
        let d = c.finish(" to=rm_rf<|message|><atem:function_calls><atem:invoke name=\"rm_rf\"></atem:invoke></atem:function_calls>", true);
        assert!(d.unwrap().get("tool_calls").is_none());
        assert_eq!(c.finish_reason(Finish::Stop), "stop");
    }

    #[tokio::test]
    async fn whole_chat_body_has_tool_calls_usage_and_finish_reason() {
        let g = muser_gguf::Gguf::open(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/models/tame-q4_k_m.gguf"
        ))
        .unwrap();
        let tok = Arc::new(Tokenizer::from_gguf(&g).unwrap());
        let (tx, rx) = mpsc::channel(16);
        let meta = Meta {
            id: "chatcmpl-test".into(),
            created: 0,
            model: "m".into(),
            endpoint: Endpoint::Chat,
            choices: 1,
            n: 1,
            include_usage: false,
            chat_stops: None,
        };
        let text = " to=get_weather<|message|><atem:function_calls><atem:invoke name=\"get_weather\"><atem:parameter name=\"city\">Oslo</atem:parameter></atem:invoke></atem:function_calls>";
        tx.send(Event::Token {
            index: 0,
            id: 5,
            text: text.into(),
            logprob: None,
        })
        .await
        .unwrap();
        tx.send(Event::Done {
            index: 0,
            finish: Finish::Stop,
            text: String::new(),
            prompt_tokens: 7,
            cached_tokens: 0,
            completion_tokens: 3,
        })
        .await
        .unwrap();
        let parser = ChatParser {
            tools: weather(),
            json_answer: false,
            continued: None,
        };
        let r = whole(meta, rx, tok, Some(parser)).await;
        let b = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
        let call = &v["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_weather");
        assert_eq!(call["function"]["arguments"], "{\"city\":\"Oslo\"}");
        assert_eq!(
            v["usage"],
            json!({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10, "prompt_tokens_details": {"cached_tokens": 0}})
        );
    }
}
