//! The `tokenizer.ggml.*` keys of a GGUF, read and checked once.
//!
//! Key names and token types follow llama.cpp (`gguf-py/gguf/constants.py`, `src/llama-vocab.cpp`
//! `llama_vocab::impl::load`); the converter writes them in `conversion/base.py` `_set_vocab_gpt2`.

use muser_gguf::{Array, Gguf, Value};

use crate::error::{Result, TextError};

/// What a token is, as `tokenizer.ggml.token_type` says (llama.cpp `llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// An ordinary BPE token, stored in byte-level form ("Ġthe").
    Normal,
    Unknown,
    /// A special token (HF `special=True`): atomic, skipped by `skip_special` decoding, only parsed
    /// from text when special parsing is on.
    Control,
    /// An added, non-special token (HF `special=False`): always atomic, never skipped.
    UserDefined,
    /// A filler id the HF tokenizer does not know (`[PADn]`): never produced, decodes to nothing.
    Unused,
    Byte,
}

impl TokenType {
    /// llama.cpp's `llama_token_type` values; 0 (undefined) reads as normal, as llama.cpp
    /// tokenizes it. Any other value is not a type this tokenizer knows: None.
    fn from_gguf(v: i64) -> Option<Self> {
        Some(match v {
            0 | 1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => return None,
        })
    }
}

/// The pre-tokenizer regex family named by `tokenizer.ggml.pre`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `llama4` / `gpt-4o`: Llama-4's (o200k-style) split; the Muse Glimmer vocabulary.
    Llama4,
    /// `llama-bpe`: Llama-3's split; supported so llama.cpp's own reference cases can be checked.
    Llama3,
}

/// The tokenizer half of a GGUF.
#[derive(Debug, Clone)]
pub struct Vocab {
    pub pre: PreTokenizer,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: Vec<String>,
    pub types: Vec<TokenType>,
    /// `tokenizer.ggml.merges`, in priority order.
    pub merges: Vec<(String, String)>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub pad: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`: whether a plain prompt starts with BOS.
    pub add_bos: bool,
    pub add_eos: bool,
}

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";

impl Vocab {
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let model = string_key(g, KEY_MODEL, || {
            TextError::Vocab(format!(
                "missing '{KEY_MODEL}': this GGUF carries no tokenizer"
            ))
        })?;
        if model != "gpt2" {
            return Err(TextError::Unsupported(format!(
                "{KEY_MODEL} = {model:?}; Muser implements the byte-level BPE ('gpt2') that Muse Glimmer uses"
            )));
        }
        // llama.cpp maps "llama4" and "gpt-4o" to one pre-tokenizer (LLAMA_VOCAB_PRE_TYPE_GPT4O).
        // Absent, llama.cpp takes its "default" pre-tokenizer, which Muser does not implement.
        let pre_name = string_key(g, KEY_PRE, || {
            TextError::Unsupported(format!(
                "missing '{KEY_PRE}': llama.cpp would split text with its 'default' pre-tokenizer; supported: 'llama4' (Muse Glimmer), 'gpt-4o', 'llama-bpe'"
            ))
        })?;
        let pre = match pre_name {
            "llama4" | "gpt-4o" => PreTokenizer::Llama4,
            "llama-bpe" | "llama3" => PreTokenizer::Llama3,
            other => {
                return Err(TextError::Unsupported(format!(
                    "{KEY_PRE} = {other:?}; supported: 'llama4' (Muse Glimmer), 'gpt-4o', 'llama-bpe'"
                )));
            }
        };
        let tokens = match g.get(KEY_TOKENS) {
            Some(Value::Array(Array::String(t))) => t.clone(),
            Some(v) => return Err(wrong_type(KEY_TOKENS, "an array of strings", v)),
            None => return Err(TextError::Vocab(format!("missing '{KEY_TOKENS}'"))),
        };
        if tokens.is_empty() || tokens.len() > u32::MAX as usize {
            return Err(TextError::Vocab(format!(
                "'{KEY_TOKENS}' holds {} tokens",
                tokens.len()
            )));
        }
        let types = match g.get(KEY_TYPES) {
            // Without the types every control token would be split into ordinary pieces: the
            // model would get other ids for the chat template's markers and still write fluent
            // text. Refused.
            None => {
                return Err(TextError::Vocab(format!(
                    "missing '{KEY_TYPES}': without it the control tokens cannot be told apart"
                )));
            }
            Some(Value::Array(a)) => {
                let v = a.as_i64s().ok_or_else(|| {
                    wrong_type(KEY_TYPES, "an integer array", &Value::Array(a.clone()))
                })?;
                if v.len() != tokens.len() {
                    return Err(TextError::Vocab(format!(
                        "'{KEY_TYPES}' has {} entries for {} tokens",
                        v.len(),
                        tokens.len()
                    )));
                }
                v.into_iter()
                    .enumerate()
                    .map(|(i, t)| {
                        TokenType::from_gguf(t).ok_or_else(|| {
                            TextError::Vocab(format!(
                                "'{KEY_TYPES}'[{i}] = {t} is not a token type (0 to 6)"
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>>>()?
            }
            Some(v) => return Err(wrong_type(KEY_TYPES, "an integer array", v)),
        };
        let merges = match g.get(KEY_MERGES) {
            Some(Value::Array(Array::String(m))) => m
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    split_merge(m).ok_or_else(|| {
                        TextError::Vocab(format!(
                            "'{KEY_MERGES}'[{i}] = {m:?} is not two tokens separated by a space"
                        ))
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            Some(v) => return Err(wrong_type(KEY_MERGES, "an array of strings", v)),
            None => {
                return Err(TextError::Vocab(format!(
                    "missing '{KEY_MERGES}': a BPE vocabulary needs its merges"
                )));
            }
        };
        let n = tokens.len();
        let id = |key: &str| -> Result<Option<u32>> {
            match g.get(key).map(|v| (v, v.as_i64())) {
                None => Ok(None),
                Some((_, Some(i))) if i >= 0 && (i as u64) < n as u64 => Ok(Some(i as u32)),
                // llama.cpp treats -1 as "none".
                Some((_, Some(-1))) => Ok(None),
                Some((v, _)) => Err(TextError::Vocab(format!(
                    "'{key}' = {} is not a token id below {n}",
                    v.summary(4)
                ))),
            }
        };
        let flag = |key: &str, default: bool| -> Result<bool> {
            match g.get(key) {
                None => Ok(default),
                Some(v) => v.as_bool().ok_or_else(|| wrong_type(key, "a bool", v)),
            }
        };
        // llama.cpp reads `add_space_prefix` for a BPE vocabulary too and then drops a leading
        // space when it detokenizes (llama-vocab.cpp, `remove_space`); Muser does not: such a
        // file would not give llama.cpp's text, so it is refused. (False, or absent, is what the
        // converter writes for byte-level BPE.)
        if flag("tokenizer.ggml.add_space_prefix", false)? {
            return Err(TextError::Unsupported(
                "'tokenizer.ggml.add_space_prefix' is true: llama.cpp then drops a leading space when it detokenizes a BPE vocabulary, which Muser does not do".into(),
            ));
        }
        // llama.cpp appends EOS to every tokenized prompt when `add_eos_token` is true
        // (llama-vocab.cpp, the BPE branch of `tokenize`); Muser does not. False, or absent, is
        // what the converter writes for Muse Glimmer's vocabulary; true is refused.
        if flag("tokenizer.ggml.add_eos_token", false)? {
            return Err(TextError::Unsupported(
                "'tokenizer.ggml.add_eos_token' is true: llama.cpp then appends EOS to every prompt, which Muser does not do".into(),
            ));
        }
        // llama.cpp's sampler never draws the tokens `suppress_tokens` lists (their logits set
        // to -inf: llama-vocab.cpp, common/sampling.cpp); Muser's samplers know no such list,
        // so a file that names any is refused rather than sampled differently.
        match g.get("tokenizer.ggml.suppress_tokens") {
            None => {}
            Some(Value::Array(a)) if a.is_empty() => {}
            Some(v) => {
                return Err(TextError::Unsupported(format!(
                    "'tokenizer.ggml.suppress_tokens' = {}: tokens llama.cpp never samples; Muser does not implement that list",
                    v.summary(4)
                )));
            }
        }
        // Byte-level BPE spells any text with its 256 byte characters; a vocabulary that lacks
        // one cannot encode text holding that byte (llama.cpp fails there, transformers drops
        // the byte): refused here, with the first missing byte named.
        {
            let singles: std::collections::HashSet<char> = tokens
                .iter()
                .filter_map(|t| {
                    let mut c = t.chars();
                    match (c.next(), c.next()) {
                        (Some(ch), None) => Some(ch),
                        _ => None,
                    }
                })
                .collect();
            if let Some(b) =
                (0..=255u8).find(|&b| !singles.contains(&crate::byte_level::byte_to_char(b)))
            {
                return Err(TextError::Vocab(format!(
                    "'{KEY_TOKENS}' lacks the byte-level token for byte 0x{b:02x} ({:?}): text holding that byte could not be encoded",
                    crate::byte_level::byte_to_char(b)
                )));
            }
        }
        let eot = id("tokenizer.ggml.eot_token_id")?;
        if pre == PreTokenizer::Llama4 && eot.is_none() {
            // Muse Glimmer ends every turn with <|eot|>: without its id generation would run
            // past the end of the assistant's turn.
            return Err(TextError::Vocab(
                "missing 'tokenizer.ggml.eot_token_id': a Muse Glimmer vocabulary names its end-of-turn token (<|eot|>)".into(),
            ));
        }
        Ok(Self {
            pre,
            merges,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            eot,
            eom: id("tokenizer.ggml.eom_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            // Defaults when the key is absent, as llama-vocab.cpp sets them per pre-tokenizer before reading
            // it: true for llama-bpe, false for llama4/gpt-4o.
            add_bos: flag("tokenizer.ggml.add_bos_token", pre == PreTokenizer::Llama3)?,
            add_eos: flag("tokenizer.ggml.add_eos_token", false)?,
            tokens,
            types,
        })
    }
}

/// "Ġ t" -> ("Ġ", "t"). llama.cpp searches for the separator from index 1
/// (`word.find(' ', 1)` in llama-vocab.cpp) so that a merge whose left side is " " still splits.
fn split_merge(m: &str) -> Option<(String, String)> {
    let start = m.char_indices().nth(1).map(|(i, _)| i)?;
    let pos = start + m[start..].find(' ')?;
    Some((m[..pos].to_string(), m[pos + 1..].to_string()))
}

/// The string at `key`: `missing()` where it is absent, a wrong-type error where it is not a
/// string.
fn string_key<'a>(g: &'a Gguf, key: &str, missing: impl FnOnce() -> TextError) -> Result<&'a str> {
    let v = g.get(key).ok_or_else(missing)?;
    v.as_str().ok_or_else(|| wrong_type(key, "a string", v))
}

fn wrong_type(key: &str, want: &str, v: &Value) -> TextError {
    TextError::Vocab(format!("'{key}' should be {want}, found {}", v.summary(3)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_split_at_the_first_space_after_the_first_char() {
        assert_eq!(split_merge("Ġ t"), Some(("Ġ".into(), "t".into())));
        assert_eq!(split_merge("  x"), Some((" ".into(), "x".into())));
        assert_eq!(split_merge("ab"), None);
        assert_eq!(split_merge(""), None);
    }
}
