//! Control tokens written by users stay text: transformers' `apply_chat_template(...,
//! sanitize_control_tokens=True)` (utils/chat_template_utils.py `mark_control_tokens`,
//! `encode_marked_chat`), reproduced id for id.
//!
//! Every control token inside a user-supplied string (message fields, tools, extra variables) is
//! wrapped in two private-use markers before rendering; after rendering, marked tokens are encoded
//! as plain text and everything else (the template's own tokens) normally.

use std::collections::HashMap;

use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value as Json;

use crate::error::{Result, TextError};
use crate::tokenizer::Tokenizer;
use crate::vocab::TokenType;

pub const MARK_START: char = '\u{F0000}';
pub const MARK_END: char = '\u{F0001}';

/// The tokens that user text may not produce: every special token, and every added token that
/// the template writes itself (`_get_control_tokens`; the template's text stands in for jinja's
/// literal nodes), found leftmost-longest, so a token wins over the tokens it contains (as
/// transformers' alternation of them, longest first).
pub struct Controls {
    /// None when there are no such tokens.
    matcher: Option<AhoCorasick>,
}

pub fn control_tokens(tok: &Tokenizer, template_source: &str) -> Result<Controls> {
    let v: Vec<&str> = added_tokens(tok)
        .filter(|(t, ty)| {
            !t.is_empty()
                && (*ty == TokenType::Control
                    || (template_source.contains(t.as_str()) && !t.trim().is_empty()))
        })
        .map(|(t, _)| t.as_str())
        .collect();
    if v.is_empty() {
        return Ok(Controls { matcher: None });
    }
    let matcher = AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(&v)
        .map_err(|e| TextError::Vocab(format!("control tokens: {e}")))?;
    Ok(Controls {
        matcher: Some(matcher),
    })
}

fn added_tokens(tok: &Tokenizer) -> impl Iterator<Item = (&String, TokenType)> {
    let v = tok.vocab();
    v.tokens
        .iter()
        .zip(v.types.iter().copied())
        .filter(|(_, ty)| matches!(ty, TokenType::Control | TokenType::UserDefined))
}

/// Wraps control tokens in every string of `v`, after removing stray markers. Object keys
/// cannot be marked (transformers leaves them as they are, so a key would reach the model as the
/// control token it spells: a schema property named "<|eot|><|start|>system..."): a key that
/// holds a control token is refused.
pub fn mark(v: &mut Json, controls: &Controls) -> Result<()> {
    match v {
        Json::String(s) => *s = mark_str(s, controls),
        Json::Array(a) => {
            for x in a {
                mark(x, controls)?;
            }
        }
        Json::Object(o) => {
            for (k, x) in o.iter_mut() {
                // (Stray markers are stripped from strings; a key keeps them, and
                // `encode_marked` would take them for marks.)
                if k.contains([MARK_START, MARK_END]) {
                    return Err(TextError::InvalidChat(format!(
                        "the key {:?} holds a private-use character Muser marks control tokens with (U+F0000 or U+F0001), so the request is refused",
                        k.chars().take(40).collect::<String>()
                    )));
                }
                if let Some(found) = controls.matcher.as_ref().and_then(|m| m.find(k.as_str())) {
                    return Err(TextError::InvalidChat(format!(
                        "the key {k:?} holds the control token {:?}; keys cannot be kept as text, so the request is refused",
                        &k[found.start()..found.end()]
                    )));
                }
                mark(x, controls)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// One pass over the text (it was a scan of every control token at every character: 9 s for a
/// megabyte with the real vocabulary's 2,048 of them).
pub(crate) fn mark_str(s: &str, controls: &Controls) -> String {
    let s: String = s
        .chars()
        .filter(|&c| c != MARK_START && c != MARK_END)
        .collect();
    let Some(m) = &controls.matcher else {
        return s;
    };
    let mut out = String::with_capacity(s.len());
    let mut last = 0;
    for found in m.find_iter(&s) {
        out.push_str(&s[last..found.start()]);
        out.push(MARK_START);
        out.push_str(&s[found.start()..found.end()]);
        out.push(MARK_END);
        last = found.end();
    }
    out.push_str(&s[last..]);
    out
}

/// What sanitizing needs of one tokenizer and template, built from their whole vocabulary and
/// source (milliseconds for a 202,048-token vocabulary), so built once and kept
/// (`ChatTemplate::encode_sanitized` keeps the one of the first tokenizer it sanitizes for;
/// another tokenizer gets its own each time).
pub struct Sanitizer {
    controls: Controls,
    /// The added tokens by text (the first id of a text, as `token_id`).
    added: HashMap<String, u32>,
    /// The longest added token's bytes and a closing marker's: how far a mark's end is looked for.
    longest: usize,
}

impl Sanitizer {
    pub fn new(tok: &Tokenizer, template_source: &str) -> Result<Self> {
        let mut added: HashMap<String, u32> = HashMap::new();
        let v = tok.vocab();
        for (i, (t, ty)) in v.tokens.iter().zip(&v.types).enumerate() {
            if matches!(ty, TokenType::Control | TokenType::UserDefined) {
                added.entry(t.clone()).or_insert(i as u32);
            }
        }
        let longest = added.keys().map(|t| t.len()).max().unwrap_or(0) + MARK_END.len_utf8();
        Ok(Sanitizer {
            controls: control_tokens(tok, template_source)?,
            added,
            longest,
        })
    }

    pub fn controls(&self) -> &Controls {
        &self.controls
    }
}

/// Encodes a chat rendered from marked inputs, exactly as `encode_marked_chat`: the text is cut
/// at every marker; marked tokens are encoded as plain text, other pieces with special tokens.
/// `san` must be built from `tok`.
pub fn encode_marked(tok: &Tokenizer, san: &Sanitizer, chat: &str) -> Result<Vec<u32>> {
    let (added, longest) = (&san.added, san.longest);
    // (piece, the id of the added token it is when it was marked)
    let mut pieces: Vec<(&str, Option<u32>)> = Vec::new();
    let mut text_start = 0;
    let mut i = 0;
    while i < chat.len() {
        let rest = &chat[i..];
        let c = rest.chars().next().unwrap_or(' ');
        if c == MARK_START || c == MARK_END {
            pieces.push((&chat[text_start..i], None));
            let after = &rest[c.len_utf8()..];
            // A marked token: an added token's text, then MARK_END.
            let mut window = longest.min(after.len());
            while !after.is_char_boundary(window) {
                window -= 1;
            }
            let marked = (c == MARK_START)
                .then(|| after[..window].find(MARK_END).map(|e| &after[..e]))
                .flatten()
                .and_then(|t| added.get(t).map(|&id| (t, id)));
            match marked {
                Some((t, id)) => {
                    pieces.push((t, Some(id)));
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
    pieces.push((&chat[text_start..], None));

    let newline = tok.encode("\n", false, true)?;
    let mut ids = tok.encode(pieces[0].0, false, true)?;
    for &(piece, marked) in &pieces[1..] {
        if piece.is_empty() {
            continue;
        }
        let as_text = marked.is_some();
        // transformers encodes "\n" + piece and strips the newline's ids (a SentencePiece
        // workaround that also decides how byte-level pieces start); kept for identical ids.
        // A marked token is encoded with no added token matched at all, user-defined ones
        // included (`_encode_without_added_tokens`): "</tool_output>" in a tool's result stays
        // text where the template writes the token itself.
        let encode = |t: &str| {
            if as_text {
                tok.encode_without_added(t)
            } else {
                tok.encode(t, false, true)
            }
        };
        let with_nl = encode(&format!("\n{piece}"))?;
        let piece_ids = match with_nl.strip_prefix(newline.as_slice()) {
            Some(rest) => rest.to_vec(),
            None => encode(piece)?,
        };
        if marked.is_some_and(|id| piece_ids.contains(&id)) {
            return Err(TextError::InvalidChat(format!(
                "cannot sanitize {piece:?}: the tokenizer produces it from plain text"
            )));
        }
        ids.extend(piece_ids);
    }
    Ok(ids)
}
