//! The incremental parser: text in, content / reasoning / tool-call deltas out.
//!
//! Deltas concatenate to the same message for every way the text is cut: answer and reasoning
//! text is released as it comes, except a tail that may be the start of `<|eom|>`/`<|eot|>`;
//! a tool message is held until its end, then becomes tool calls or, if malformed, content.

use super::{ChatDelta, ParsedMessage, ToolCallParser};

const START: &str = "<|start|>assistant";
const MESSAGE: &str = "<|message|>";
const TO: &str = " to=";
const EOM: &str = "<|eom|>";
const EOT: &str = "<|eot|>";
/// A header's text at least this long that never reaches `<|message|>` is content at the end.
const MAX_HEADER: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Channel {
    Reasoning,
    Content,
    Tool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// After `<|eom|>`: the next message's `<|start|>assistant`.
    Start,
    /// ` to=RECIPIENT<|message|>` or `<|message|>`.
    Header,
    Body(Channel),
    /// Not the Muse Glimmer format (or reasoning extraction off without tools): all content.
    Raw,
    /// After `<|eot|>`: the turn is over.
    Done,
}

/// See [`ToolCallParser::stream`].
pub struct AtemStream {
    parser: ToolCallParser,
    state: State,
    buf: String,
    tool_body: String,
    n_calls: usize,
    msg: ParsedMessage,
    /// Bytes of text pushed so far: `buf` is always their last `buf.len()`.
    pushed: usize,
    /// Byte ranges of the pushed text released as content since `take_content_spans`, and those
    /// of the tool message under way (content too if it turns out malformed).
    spans: Vec<(usize, usize)>,
    tool_spans: Vec<(usize, usize)>,
}

impl AtemStream {
    pub(super) fn new(parser: ToolCallParser) -> Self {
        let state = if !parser.extract_reasoning && parser.tools.is_empty() {
            State::Raw
        } else {
            State::Header
        };
        Self {
            parser,
            state,
            buf: String::new(),
            tool_body: String::new(),
            n_calls: 0,
            msg: ParsedMessage::default(),
            pushed: 0,
            spans: Vec::new(),
            tool_spans: Vec::new(),
        }
    }

    /// Adds generated text; returns what is now known.
    pub fn push(&mut self, text: &str) -> Vec<ChatDelta> {
        self.buf.push_str(text);
        self.pushed += text.len();
        self.run(false)
    }

    /// Adds text that is the body of the message under way as it is, not read as markup (a
    /// message's text the output continues, written by a user: its `<|eot|>` is text); outside
    /// a message's body, as [`push`](Self::push).
    pub fn push_text(&mut self, text: &str) -> Vec<ChatDelta> {
        let State::Body(ch) = self.state else {
            return self.push(text);
        };
        if !self.buf.is_empty() {
            return self.push(text);
        }
        let mut out = Vec::new();
        let start = self.pushed;
        self.pushed += text.len();
        self.emit(ch, text.to_string(), start, &mut out);
        for d in &out {
            self.msg.apply(d);
        }
        out
    }

    /// Bytes of the pushed text the parser is done with (released, or dropped as markup):
    /// what comes after may still change role. A tool message's body is not done with until
    /// the message ends (it becomes tool calls, or content if malformed).
    pub fn consumed(&self) -> usize {
        let c = self.pushed - self.buf.len();
        self.tool_spans.first().map_or(c, |s| s.0.min(c))
    }

    /// The byte offset of `buf`'s first byte in the pushed text.
    fn at(&self) -> usize {
        self.pushed - self.buf.len()
    }

    /// The byte ranges of the pushed text that became content since the last call (a
    /// malformed tool message's body counts when it is found malformed), in order.
    pub fn take_content_spans(&mut self) -> Vec<(usize, usize)> {
        std::mem::take(&mut self.spans)
    }

    /// Ends the generation: held text is released, an unfinished tool message is parsed as it is.
    pub fn finish(&mut self) -> Vec<ChatDelta> {
        self.run(true)
    }

    /// Everything parsed so far.
    pub fn message(&self) -> &ParsedMessage {
        &self.msg
    }

    pub fn into_message(self) -> ParsedMessage {
        self.msg
    }

    fn run(&mut self, finishing: bool) -> Vec<ChatDelta> {
        let mut out = Vec::new();
        self.step(finishing, &mut out);
        for d in &out {
            self.msg.apply(d);
        }
        out
    }

    fn step(&mut self, finishing: bool, out: &mut Vec<ChatDelta>) {
        loop {
            match self.state {
                State::Done => {
                    self.buf.clear();
                    return;
                }
                State::Raw => {
                    if !self.buf.is_empty() {
                        self.spans.push((self.at(), self.pushed));
                        out.push(ChatDelta::Content(std::mem::take(&mut self.buf)));
                    }
                    return;
                }
                State::Start => {
                    if self.buf.starts_with(START) {
                        self.buf.drain(..START.len());
                        self.state = State::Header;
                    } else if START.starts_with(self.buf.as_str()) {
                        // Wait for more; a marker cut off by the end of generation is dropped.
                        if finishing {
                            self.buf.clear();
                        }
                        return;
                    } else {
                        self.state = State::Raw;
                    }
                }
                State::Header => match self.header(finishing) {
                    Some(next) => self.state = next,
                    None if finishing => {
                        self.buf.clear();
                        return;
                    }
                    None => return,
                },
                State::Body(ch) => {
                    let term = [EOM, EOT]
                        .into_iter()
                        .filter_map(|t| self.buf.find(t).map(|i| (i, t)))
                        .min();
                    if let Some((i, t)) = term {
                        let start = self.at();
                        let text = self.buf[..i].to_string();
                        self.buf.drain(..i + t.len());
                        self.emit(ch, text, start, out);
                        if ch == Channel::Tool {
                            self.end_tool(out);
                        }
                        self.state = if t == EOM { State::Start } else { State::Done };
                        continue;
                    }
                    let keep = if finishing {
                        0
                    } else {
                        terminator_prefix_len(&self.buf)
                    };
                    let start = self.at();
                    let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                    self.emit(ch, text, start, out);
                    if finishing {
                        if ch == Channel::Tool {
                            self.end_tool(out);
                        }
                        self.state = State::Done;
                    }
                    return;
                }
            }
        }
    }

    /// Reads a message header from `buf`: the next state, or `None` to wait for more text.
    fn header(&mut self, finishing: bool) -> Option<State> {
        if self.buf.starts_with(MESSAGE) {
            self.buf.drain(..MESSAGE.len());
            return Some(State::Body(Channel::Content));
        }
        if let Some(rest) = self.buf.strip_prefix(TO) {
            if let Some(i) = rest.find(MESSAGE) {
                // A recipient of any length, as the anchor's `until("<|message|>")` reads it
                // (its forced-call grammar lets a random model write one of hundreds of bytes).
                let recipient = &rest[..i];
                // Any other recipient is a tool's, empty or holding markup, as the anchor's
                // parser reads it (` to=` then any text up to `<|message|>`), and as its call
                // grammars let a call's recipient be.
                let ch = match recipient {
                    "self" if self.parser.extract_reasoning => Channel::Reasoning,
                    "self" | "user" => Channel::Content,
                    _ => Channel::Tool,
                };
                self.buf.drain(..TO.len() + i + MESSAGE.len());
                return Some(State::Body(ch));
            }
            // Before the end, `<|message|>` may still come: the text is held (a stream shows
            // nothing of it until then). At the end, a long one, or one with a stray special
            // token, was not a header: content; a short one is dropped, an unfinished header.
            let marker_at = rest
                .find("<|")
                .filter(|&j| !MESSAGE.starts_with(&rest[j..]));
            if finishing && (rest.len() >= MAX_HEADER + MESSAGE.len() || marker_at.is_some()) {
                return Some(State::Raw);
            }
            return None;
        }
        if MESSAGE.starts_with(self.buf.as_str()) || TO.starts_with(self.buf.as_str()) {
            return None;
        }
        Some(State::Raw)
    }

    /// Releases `text`, which began at byte `start` of the pushed text.
    fn emit(&mut self, ch: Channel, text: String, start: usize, out: &mut Vec<ChatDelta>) {
        if text.is_empty() {
            return;
        }
        let span = (start, start + text.len());
        match ch {
            Channel::Content => {
                self.spans.push(span);
                out.push(ChatDelta::Content(text))
            }
            Channel::Reasoning => out.push(ChatDelta::Reasoning(text)),
            Channel::Tool => {
                self.tool_spans.push(span);
                self.tool_body.push_str(&text)
            }
        }
    }

    fn end_tool(&mut self, out: &mut Vec<ChatDelta>) {
        let body = std::mem::take(&mut self.tool_body);
        match self.parser.calls(&body, self.n_calls) {
            Some(calls) => {
                for call in calls {
                    out.push(ChatDelta::ToolCall {
                        index: self.n_calls,
                        call,
                    });
                    self.n_calls += 1;
                }
            }
            None if body.is_empty() => {}
            None => {
                self.spans.append(&mut self.tool_spans);
                out.push(ChatDelta::Content(body))
            }
        }
        self.tool_spans.clear();
    }
}

/// Length of the longest tail of `s` that is a proper prefix of `<|eom|>` or `<|eot|>`.
fn terminator_prefix_len(s: &str) -> usize {
    (1..EOM.len())
        .rev()
        .find(|&n| {
            n <= s.len() && s.is_char_boundary(s.len() - n) && {
                let tail = &s[s.len() - n..];
                EOM.starts_with(tail) || EOT.starts_with(tail)
            }
        })
        .unwrap_or(0)
}
