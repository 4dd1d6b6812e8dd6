//! The chat path's OpenAI chunks as the parts of an answer, for the other APIs' adapters
//! (`anthropic`, `responses`): each writes these parts as its own message or its own stream
//! events, so that a whole answer is what the same request streamed adds up to, with its parts
//! in the order the model wrote them.

use futures_util::{Stream, StreamExt};
use serde_json::Value;

use crate::error::ApiError;

/// What a part of an answer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Reasoning,
    Text,
    /// One tool call (each is a part of its own).
    Call,
}

/// A step of an answer being written.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Part `index` begins; a call's carries its id and function name.
    Start {
        index: usize,
        kind: Kind,
        call: Option<(String, String)>,
    },
    /// More of part `index`: reasoning or answer text, or a call's arguments (a JSON text).
    Delta {
        index: usize,
        kind: Kind,
        text: String,
    },
    /// Part `index` is whole.
    Stop { index: usize, kind: Kind },
    /// The answer is whole: the chat path's finish reason (`stop`, `length`, `tool_calls`), the
    /// stop string that ended it, and OpenAI's usage object.
    End {
        finish: String,
        stop_string: Option<String>,
        usage: Value,
    },
}

/// Reads the chat path's chunks (one choice, `include_usage` on: the last chunk carries the
/// usage) as parts, one open at a time, each stopped before the next starts: reasoning and text
/// parts go on while the model writes them, a call is a part of its own.
#[derive(Default)]
pub struct Translate {
    opened: usize,
    open: Option<Kind>,
    /// The choice's finish reason and matched stop string, once a chunk has given them.
    finish: Option<(String, Option<String>)>,
}

impl Translate {
    fn close(&mut self, out: &mut Vec<Op>) {
        if let Some(kind) = self.open.take() {
            out.push(Op::Stop {
                index: self.opened - 1,
                kind,
            });
        }
    }

    /// The index of an open part of `kind` (started unless one is open already; a call always
    /// anew).
    fn want(&mut self, kind: Kind, call: Option<(String, String)>, out: &mut Vec<Op>) -> usize {
        if self.open != Some(kind) || kind == Kind::Call {
            self.close(out);
            out.push(Op::Start {
                index: self.opened,
                kind,
                call,
            });
            self.opened += 1;
            self.open = Some(kind);
        }
        self.opened - 1
    }

    /// The steps of one chunk; the one with the usage ends the answer.
    pub fn chunk(&mut self, c: &Value) -> Vec<Op> {
        let mut out = Vec::new();
        if let Some(u) = c.get("usage").filter(|u| !u.is_null()) {
            let (finish, stop_string) = self.finish.take().unwrap_or_else(|| ("stop".into(), None));
            self.close(&mut out);
            out.push(Op::End {
                finish,
                stop_string,
                usage: u.clone(),
            });
            return out;
        }
        let ch = &c["choices"][0];
        let d = &ch["delta"];
        let mut text = |kind: Kind, t: &Value, out: &mut Vec<Op>| {
            if let Some(t) = t.as_str().filter(|t| !t.is_empty()) {
                let index = self.want(kind, None, out);
                out.push(Op::Delta {
                    index,
                    kind,
                    text: t.to_string(),
                });
            }
        };
        text(Kind::Reasoning, &d["reasoning_content"], &mut out);
        text(Kind::Text, &d["content"], &mut out);
        for call in d["tool_calls"].as_array().into_iter().flatten() {
            let f = &call["function"];
            let id = call["id"].as_str().unwrap_or("").to_string();
            let name = f["name"].as_str().unwrap_or("").to_string();
            let index = self.want(Kind::Call, Some((id, name)), &mut out);
            if let Some(args) = f["arguments"].as_str().filter(|a| !a.is_empty()) {
                out.push(Op::Delta {
                    index,
                    kind: Kind::Call,
                    text: args.to_string(),
                });
            }
        }
        if let Some(f) = ch["finish_reason"].as_str() {
            self.finish = Some((f.to_string(), ch["stop_reason"].as_str().map(String::from)));
        }
        out
    }
}

/// Whether `ops` end the answer.
pub fn ends(ops: &[Op]) -> bool {
    ops.iter().any(|o| matches!(o, Op::End { .. }))
}

/// The chat path's chunks (with their usage) read as parts and handed to `apply` in order,
/// until it gives the whole answer (at the end, `Op::End`).
pub async fn fold<T>(
    chunks: impl Stream<Item = Result<Value, ApiError>>,
    mut apply: impl FnMut(Op) -> Option<T>,
) -> Result<T, ApiError> {
    let mut t = Translate::default();
    futures_util::pin_mut!(chunks);
    while let Some(c) = chunks.next().await {
        for op in t.chunk(&c?) {
            if let Some(whole) = apply(op) {
                return Ok(whole);
            }
        }
    }
    Err(ApiError::internal("the response ended without its usage"))
}

/// Appends `text` to the string `v` holds (a part's text so far; null is empty).
pub fn push_text(v: &mut Value, text: &str) {
    let mut s = v.as_str().unwrap_or("").to_string();
    s.push_str(text);
    *v = Value::String(s);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn delta(d: Value, finish: Option<&str>) -> Value {
        json!({"choices": [{"index": 0, "delta": d, "finish_reason": finish, "stop_reason": null}]})
    }

    #[test]
    fn parts_open_in_the_order_written_one_at_a_time() {
        let call = |id: &str, args: &str| {
            json!({"tool_calls": [{"index": 0, "id": id, "type": "function",
                "function": {"name": "f", "arguments": args}}]})
        };
        let mut t = Translate::default();
        let ops: Vec<Op> = [
            delta(json!({"role": "assistant", "content": ""}), None),
            delta(json!({"reasoning_content": "Need "}), None),
            delta(json!({"reasoning_content": "data."}), None),
            delta(json!({"content": "Look."}), None),
            delta(call("c1", "{\"a\":1}"), None),
            delta(call("c2", "{}"), Some("tool_calls")),
            json!({"choices": [], "usage": {"prompt_tokens": 3}}),
        ]
        .iter()
        .flat_map(|c| t.chunk(c))
        .collect();
        let d = |index, kind, text: &str| Op::Delta {
            index,
            kind,
            text: text.into(),
        };
        let start = |index, kind, call: Option<(&str, &str)>| Op::Start {
            index,
            kind,
            call: call.map(|(a, b)| (a.into(), b.into())),
        };
        assert_eq!(
            ops,
            vec![
                start(0, Kind::Reasoning, None),
                d(0, Kind::Reasoning, "Need "),
                d(0, Kind::Reasoning, "data."),
                Op::Stop {
                    index: 0,
                    kind: Kind::Reasoning
                },
                start(1, Kind::Text, None),
                d(1, Kind::Text, "Look."),
                Op::Stop {
                    index: 1,
                    kind: Kind::Text
                },
                start(2, Kind::Call, Some(("c1", "f"))),
                d(2, Kind::Call, "{\"a\":1}"),
                Op::Stop {
                    index: 2,
                    kind: Kind::Call
                },
                start(3, Kind::Call, Some(("c2", "f"))),
                d(3, Kind::Call, "{}"),
                Op::Stop {
                    index: 3,
                    kind: Kind::Call
                },
                Op::End {
                    finish: "tool_calls".into(),
                    stop_string: None,
                    usage: json!({"prompt_tokens": 3})
                },
            ]
        );
        assert!(ends(&ops));
    }
}
