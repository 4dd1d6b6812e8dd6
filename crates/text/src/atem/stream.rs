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
/// A recipient longer than this without `<|message|>` is not a header.
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
        }
    }

    /// Adds generated text; returns what is now known.
    pub fn push(&mut self, text: &str) -> Vec<ChatDelta> {
        self.buf.push_str(text);
        self.run(false)
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
                State::Header => match self.header() {
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
                        let text = self.buf[..i].to_string();
                        self.buf.drain(..i + t.len());
                        self.emit(ch, text, out);
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
                    let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                    self.emit(ch, text, out);
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
    fn header(&mut self) -> Option<State> {
        if self.buf.starts_with(MESSAGE) {
            self.buf.drain(..MESSAGE.len());
            return Some(State::Body(Channel::Content));
        }
        if let Some(rest) = self.buf.strip_prefix(TO) {
            if let Some(i) = rest.find(MESSAGE) {
                let recipient = &rest[..i];
                let ch = match recipient {
                    "self" if self.parser.extract_reasoning => Channel::Reasoning,
                    "self" | "user" => Channel::Content,
                    r if r.contains("<|") || r.trim().is_empty() => return Some(State::Raw),
                    _ => Channel::Tool,
                };
                self.buf.drain(..TO.len() + i + MESSAGE.len());
                return Some(State::Body(ch));
            }
            // A stray special token or an endless recipient: not a header.
            let marker_at = rest
                .find("<|")
                .filter(|&j| !MESSAGE.starts_with(&rest[j..]));
            if rest.len() > MAX_HEADER || marker_at.is_some() {
                return Some(State::Raw);
            }
            return None;
        }
        if MESSAGE.starts_with(self.buf.as_str()) || TO.starts_with(self.buf.as_str()) {
            return None;
        }
        Some(State::Raw)
    }

    fn emit(&mut self, ch: Channel, text: String, out: &mut Vec<ChatDelta>) {
        if text.is_empty() {
            return;
        }
        match ch {
            Channel::Content => out.push(ChatDelta::Content(text)),
            Channel::Reasoning => out.push(ChatDelta::Reasoning(text)),
            Channel::Tool => self.tool_body.push_str(&text),
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
            None => out.push(ChatDelta::Content(body)),
        }
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
