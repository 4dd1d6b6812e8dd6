//! Control tokens written by users stay text: transformers' `apply_chat_template(...,
//! sanitize_control_tokens=True)` (utils/chat_template_utils.py `mark_control_tokens`,
//! `encode_marked_chat`), reproduced id for id.
//!
//! Every control token inside a user-supplied string (message fields, tools, extra variables) is
//! wrapped in two private-use markers before rendering; after rendering, marked tokens are encoded
//! as plain text and everything else (the template's own tokens) normally.

use serde_json::Value as Json;

use crate::error::{Result, TextError};
use crate::tokenizer::Tokenizer;
use crate::vocab::TokenType;

pub const MARK_START: char = '\u{F0000}';
pub const MARK_END: char = '\u{F0001}';

/// The tokens that user text may not produce: every special token, and every added token that
/// the template writes itself (`_get_control_tokens`; the template's text stands in for jinja's
/// literal nodes), longest first so a token wins over the tokens it contains.
pub fn control_tokens(tok: &Tokenizer, template_source: &str) -> Vec<String> {
    let mut v: Vec<String> = added_tokens(tok)
        .filter(|(t, ty)| {
            *ty == TokenType::Control
                || (template_source.contains(t.as_str()) && !t.trim().is_empty())
        })
        .map(|(t, _)| t.to_string())
        .collect();
    v.sort_by_key(|t| std::cmp::Reverse(t.len()));
    v
}

fn added_tokens(tok: &Tokenizer) -> impl Iterator<Item = (&String, TokenType)> {
    let v = tok.vocab();
    v.tokens
        .iter()
        .zip(v.types.iter().copied())
        .filter(|(_, ty)| matches!(ty, TokenType::Control | TokenType::UserDefined))
}

/// Wraps control tokens in every string of `v` (not in object keys), after removing stray markers.
pub fn mark(v: &mut Json, tokens: &[String]) {
    match v {
        Json::String(s) => *s = mark_str(s, tokens),
        Json::Array(a) => a.iter_mut().for_each(|x| mark(x, tokens)),
        Json::Object(o) => o.values_mut().for_each(|x| mark(x, tokens)),
        _ => {}
    }
}

fn mark_str(s: &str, tokens: &[String]) -> String {
    let s: String = s
        .chars()
        .filter(|&c| c != MARK_START && c != MARK_END)
        .collect();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if let Some(t) = tokens.iter().find(|t| s[i..].starts_with(t.as_str())) {
            out.push(MARK_START);
            out.push_str(t);
            out.push(MARK_END);
            i += t.len();
        } else {
            let c = s[i..].chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Encodes a chat rendered from marked inputs, exactly as `encode_marked_chat`: the text is cut
/// at every marker; marked tokens are encoded as plain text, other pieces with special tokens.
pub fn encode_marked(tok: &Tokenizer, chat: &str) -> Result<Vec<u32>> {
    let mut all: Vec<&str> = added_tokens(tok).map(|(t, _)| t.as_str()).collect();
    all.sort_by_key(|t| std::cmp::Reverse(t.len()));
    // (piece, is a marked token)
    let mut pieces: Vec<(&str, bool)> = Vec::new();
    let mut text_start = 0;
    let mut i = 0;
    while i < chat.len() {
        let rest = &chat[i..];
        let c = rest.chars().next().unwrap_or(' ');
        if c == MARK_START || c == MARK_END {
            pieces.push((&chat[text_start..i], false));
            let after = &rest[c.len_utf8()..];
            let marked = (c == MARK_START)
                .then(|| {
                    all.iter().find(|t| {
                        after
                            .strip_prefix(**t)
                            .is_some_and(|r| r.starts_with(MARK_END))
                    })
                })
                .flatten();
            match marked {
                Some(t) => {
                    pieces.push((t, true));
                    i += c.len_utf8() + t.len() + MARK_END.len_utf8();
                }
                // A lone marker: dropped, but it still separates the text around it.
                None => i += c.len_utf8(),
            }
            text_start = i;
        } else {
            i += c.len_utf8();
        }
    }
    pieces.push((&chat[text_start..], false));

    let newline = tok.encode("\n", false, true)?;
    let mut ids = tok.encode(pieces[0].0, false, true)?;
    for &(piece, as_text) in &pieces[1..] {
        if piece.is_empty() {
            continue;
        }
        // transformers encodes "\n" + piece and strips the newline's ids (a SentencePiece
        // workaround that also decides how byte-level pieces start); kept for identical ids.
        let with_nl = tok.encode(&format!("\n{piece}"), false, !as_text)?;
        let piece_ids = match with_nl.strip_prefix(newline.as_slice()) {
            Some(rest) => rest.to_vec(),
            None => tok.encode(piece, false, !as_text)?,
        };
        if as_text
            && tok
                .token_id(piece)
                .is_some_and(|id| piece_ids.contains(&id))
        {
            return Err(TextError::InvalidChat(format!(
                "cannot sanitize {piece:?}: the tokenizer produces it from plain text"
            )));
        }
        ids.extend(piece_ids);
    }
    Ok(ids)
}
