//! The GGUF's byte-level BPE, encoding and decoding exactly as the model's HF tokenizer does.
//!
//! Encoding is HF `tokenizers` itself (pure Rust, `fancy-regex`), built in memory from the GGUF:
//! the same pipeline as Llama-4's tokenizer.json (added-token split, regex `Split` (Isolated),
//! `ByteLevel` without its own regex, BPE). Decoding is a table of each token's bytes, computed with
//! HF's ByteLevel decoder rule, so that whole and streamed decoding are the same bytes.

use std::path::Path;
use std::sync::Arc;

use muser_gguf::Gguf;
use rayon::prelude::*;
use tokenizers::models::bpe::{BPE, BpeTrainer};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, Model, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    SplitDelimiterBehavior, Token, TokenizerImpl,
};

use crate::byte_level::token_bytes;
use crate::error::{Result, TextError};
use crate::vocab::{PreTokenizer, TokenType, Vocab};

/// Llama-4's split, verbatim from its tokenizer.json (quoted in llama.cpp src/llama-vocab.cpp,
/// LLAMA_VOCAB_PRE_TYPE_GPT4O, "original regex from tokenizer.json"). llama.cpp runs an adapted
/// form without `\p{M}`, which is where llama-tokenize and transformers disagree (see NOTES.md).
pub const LLAMA4_REGEX: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);

/// Llama-3's split (its tokenizer.json; llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_LLAMA3).
pub const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Inputs above this many bytes are refused unless the limit is raised ([`Tokenizer::set_max_input_bytes`]).
pub const DEFAULT_MAX_INPUT_BYTES: usize = 256 << 20;

/// Texts longer than this are encoded in independent pieces (see [`chunk_ends`]), in parallel.
const CHUNK_BYTES: usize = 64 << 10;

type Inner = TokenizerImpl<SharedBpe, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>;

/// A byte-level BPE tokenizer built from a GGUF vocabulary.
pub struct Tokenizer {
    /// Parses special (control) tokens written in the text.
    with_special: Inner,
    /// Same model (shared), but control tokens in the text are plain text (HF `split_special_tokens`).
    without_special: Inner,
    vocab: Vocab,
    /// `bytes[offsets[i]..offsets[i + 1]]` is what token `i` decodes to.
    bytes: Vec<u8>,
    offsets: Vec<usize>,
    /// Chunked encoding is exact only when no added token contains a newline.
    can_chunk: bool,
    max_input_bytes: usize,
}

impl Tokenizer {
    /// Reads the GGUF at `path` and builds its tokenizer.
    pub fn from_gguf_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let g = Gguf::open(path).map_err(|e| TextError::Io { path: path.display().to_string(), msg: e.to_string() })?;
        Self::from_gguf(&g)
    }

    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        Self::from_vocab(Vocab::from_gguf(g)?)
    }

    pub fn from_vocab(vocab: Vocab) -> Result<Self> {
        let n = vocab.tokens.len();
        // Every token but the [PADn] fillers goes into the BPE vocabulary, so that the added-token
        // table below reuses the GGUF ids (tokenizers' AddedVocabulary takes the model's id for a
        // content it already knows). The first id wins if a string repeats.
        let mut map = tokenizers::models::bpe::Vocab::with_capacity(n);
        for (id, (t, ty)) in vocab.tokens.iter().zip(&vocab.types).enumerate() {
            if *ty != TokenType::Unused {
                map.entry(t.clone()).or_insert(id as u32);
            }
        }
        let bpe = BPE::builder()
            .vocab_and_merges(map, vocab.merges.clone())
            // llama-vocab.cpp sets ignore_merges for llama-bpe only; Llama-4 runs every merge.
            .ignore_merges(vocab.pre == PreTokenizer::Llama3)
            .build()
            .map_err(|e| TextError::Vocab(format!("cannot build the BPE from the GGUF merges: {e}")))?;
        let model = SharedBpe(Arc::new(bpe));

        let regex = match vocab.pre {
            PreTokenizer::Llama4 => LLAMA4_REGEX,
            PreTokenizer::Llama3 => LLAMA3_REGEX,
        };
        let split = Split::new(SplitPattern::Regex(regex.into()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| TextError::Tokenizer(format!("pre-tokenizer regex: {e}")))?;
        let pre = PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
        ]));

        // Control tokens are HF special tokens; user-defined tokens are added non-special tokens
        // (the converter's mapping, conversion/base.py get_vocab_base, reversed).
        let added: Vec<AddedToken> = vocab
            .tokens
            .iter()
            .zip(&vocab.types)
            .filter_map(|(t, ty)| match ty {
                TokenType::Control => Some(AddedToken::from(t.clone(), true)),
                TokenType::UserDefined => Some(AddedToken::from(t.clone(), false)),
                _ => None,
            })
            .collect();
        let mut with_special = Inner::new(model.clone());
        with_special.with_pre_tokenizer(Some(pre));
        with_special.add_tokens(added).map_err(|e| TextError::Tokenizer(format!("added tokens: {e}")))?;
        let mut without_special = with_special.clone();
        without_special.set_encode_special_tokens(true);

        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        for (t, ty) in vocab.tokens.iter().zip(&vocab.types) {
            if *ty != TokenType::Unused {
                bytes.extend_from_slice(&token_bytes(t));
            }
            offsets.push(bytes.len());
        }
        let can_chunk = vocab
            .tokens
            .iter()
            .zip(&vocab.types)
            .all(|(t, ty)| !matches!(ty, TokenType::Control | TokenType::UserDefined) || !t.contains(['\n', '\r']));
        Ok(Self { with_special, without_special, vocab, bytes, offsets, can_chunk, max_input_bytes: DEFAULT_MAX_INPUT_BYTES })
    }

    /// Token ids of `text`. `add_bos` prepends BOS (the CLI passes `add_bos_default() && !no_bos`).
    /// With `parse_special` the control tokens written in the text ("<|eot|>") become their ids, as a
    /// rendered chat template needs; without it they are plain text, so user input cannot inject
    /// them. User-defined added tokens are atomic either way, as in HF.
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<u32>> {
        if text.len() > self.max_input_bytes {
            return Err(TextError::InputTooLarge { len: text.len(), limit: self.max_input_bytes });
        }
        let inner = if parse_special { &self.with_special } else { &self.without_special };
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            ids.push(self.vocab.bos.ok_or_else(|| {
                TextError::Vocab("BOS was asked for but the GGUF has no tokenizer.ggml.bos_token_id".into())
            })?);
        }
        if text.len() <= CHUNK_BYTES || !self.can_chunk {
            ids.extend(encode_piece(inner, text)?);
            return Ok(ids);
        }
        let pieces: Vec<&str> = split_at(text, &chunk_ends(text, CHUNK_BYTES));
        let encoded: Vec<Result<Vec<u32>>> = pieces.par_iter().map(|p| encode_piece(inner, p)).collect();
        for e in encoded {
            ids.extend(e?);
        }
        Ok(ids)
    }

    /// [`encode`](Self::encode) for raw bytes: invalid UTF-8 is an error naming the offset.
    pub fn encode_bytes(&self, bytes: &[u8], add_bos: bool, parse_special: bool) -> Result<Vec<u32>> {
        let text = std::str::from_utf8(bytes).map_err(|e| TextError::InvalidUtf8 { offset: e.valid_up_to() })?;
        self.encode(text, add_bos, parse_special)
    }

    /// The text of `ids`. Invalid UTF-8 (a token sequence cut inside a character) becomes U+FFFD,
    /// as in HF (`String::from_utf8_lossy`). `skip_special` drops control tokens, like HF's
    /// `skip_special_tokens`. An id outside the vocabulary is an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.piece(id, skip_special)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The bytes token `id` stands for; empty for a skipped control token or an unused id.
    pub fn piece(&self, id: u32, skip_special: bool) -> Result<&[u8]> {
        let i = id as usize;
        if i >= self.vocab.tokens.len() {
            return Err(TextError::UnknownToken { id: id.into(), n_vocab: self.vocab.tokens.len() });
        }
        if skip_special && self.vocab.types[i] == TokenType::Control {
            return Ok(&[]);
        }
        Ok(&self.bytes[self.offsets[i]..self.offsets[i + 1]])
    }

    /// Checks ids given as signed integers (from JSON), for the `detokenize` command.
    pub fn check_ids(&self, ids: &[i64]) -> Result<Vec<u32>> {
        let n = self.vocab.tokens.len();
        ids.iter()
            .map(|&i| u32::try_from(i).ok().filter(|&u| (u as usize) < n).ok_or(TextError::UnknownToken { id: i, n_vocab: n }))
            .collect()
    }

    /// The id of the token whose GGUF string is `token` ("<|eot|>", "Ġthe").
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.with_special.token_to_id(token)
    }

    /// The GGUF string of token `id`.
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.vocab.types.get(id as usize).copied()
    }

    pub fn n_vocab(&self) -> usize {
        self.vocab.tokens.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.vocab.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.vocab.eos
    }

    /// End of turn (`<|eot|>` for Muse Glimmer).
    pub fn eot(&self) -> Option<u32> {
        self.vocab.eot
    }

    /// Ids that end generation: EOS, EOT and (if the GGUF names one) EOM, as llama.cpp's
    /// `special_eog_ids`. Muse Glimmer's `<|eom|>` is not named: it separates the messages of one
    /// assistant turn (reasoning, answer, tool calls), so generation goes on past it.
    pub fn eog_ids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = [self.vocab.eos, self.vocab.eot, self.vocab.eom].into_iter().flatten().collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// `tokenizer.ggml.add_bos_token`: whether a plain prompt should start with BOS.
    pub fn add_bos_default(&self) -> bool {
        self.vocab.add_bos
    }

    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    pub fn set_max_input_bytes(&mut self, limit: usize) {
        self.max_input_bytes = limit;
    }
}

fn encode_piece(inner: &Inner, text: &str) -> Result<Vec<u32>> {
    let enc = inner.encode_fast(text, false).map_err(|e| TextError::Tokenizer(e.to_string()))?;
    Ok(enc.get_ids().to_vec())
}

/// Byte positions where `text` may be cut into pieces that encode independently to the same ids.
///
/// A cut goes after a '\n' and before a char that is neither whitespace nor '/'. No match of either
/// split regex can cross it: letter runs may not start with '\r'/'\n'; the punctuation run may only
/// end with `[\r\n/]*`; `\s*[\r\n]+` and the `\s+` forms end before non-whitespace. Added tokens
/// cannot cross it either, as long as none contains a newline (`can_chunk`). `target` is the
/// least piece length.
pub(crate) fn chunk_ends(text: &str, target: usize) -> Vec<usize> {
    let b = text.as_bytes();
    let mut ends = Vec::new();
    let mut from = 0;
    while from + target < b.len() {
        let mut p = from + target.max(1);
        let cut = loop {
            if p >= b.len() {
                break None;
            }
            // b[p] is ASCII here or the start of a multi-byte char; either is a char boundary.
            if b[p - 1] == b'\n' && b[p] != b'/' && text.is_char_boundary(p) && !starts_with_whitespace(&text[p..]) {
                break Some(p);
            }
            p += 1;
        };
        match cut {
            Some(p) => {
                ends.push(p);
                from = p;
            }
            None => break,
        }
    }
    ends
}

fn starts_with_whitespace(s: &str) -> bool {
    s.chars().next().is_some_and(char::is_whitespace)
}

fn split_at<'a>(text: &'a str, ends: &[usize]) -> Vec<&'a str> {
    let mut out = Vec::with_capacity(ends.len() + 1);
    let mut start = 0;
    for &e in ends {
        out.push(&text[start..e]);
        start = e;
    }
    out.push(&text[start..]);
    out
}

/// The BPE behind an `Arc`, so the two tokenizers (special parsing on and off) share one model
/// and one merge cache instead of two copies of a 200k-token vocabulary.
#[derive(Clone)]
struct SharedBpe(Arc<BPE>);

impl Model for SharedBpe {
    type Trainer = BpeTrainer;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        self.0.tokenize(sequence)
    }
    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.0.token_to_id(token)
    }
    fn id_to_token(&self, id: u32) -> Option<String> {
        self.0.id_to_token(id)
    }
    fn get_vocab(&self) -> std::collections::HashMap<String, u32> {
        self.0.get_vocab()
    }
    fn get_vocab_size(&self) -> usize {
        self.0.get_vocab_size()
    }
    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<std::path::PathBuf>> {
        self.0.save(folder, prefix)
    }
    fn get_trainer(&self) -> BpeTrainer {
        self.0.get_trainer()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_cuts_only_after_newline_before_non_space() {
        let t = "ab\ncd\n ef\n/gh\n\nij";
        let ends = chunk_ends(t, 1);
        for &e in &ends {
            assert_eq!(t.as_bytes()[e - 1], b'\n');
        }
        assert_eq!(ends, vec![3, 15]);
        assert_eq!(split_at(t, &ends).concat(), t);
    }

    #[test]
    fn chunked_encoding_equals_whole_encoding() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
        let tok = Tokenizer::from_gguf_file(dir.join("glimmer-mini.gguf")).unwrap();
        let golden: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("golden/tokenizer-glimmer-mini.json")).unwrap()).unwrap();
        // Every hard string, joined by separators that do and do not allow a cut.
        let seps = ["\nX", "\n", "\n/", "\n ", " ", "\r\n", "!\n", "\n\n'"];
        let mut text = String::new();
        for (i, case) in golden["cases"].as_array().unwrap().iter().enumerate() {
            text.push_str(case["text"].as_str().unwrap());
            text.push_str(seps[i % seps.len()]);
        }
        let big = text.repeat(3 * CHUNK_BYTES / text.len() + 1);
        assert!(chunk_ends(&big, CHUNK_BYTES).len() >= 2);
        for special in [true, false] {
            let inner = if special { &tok.with_special } else { &tok.without_special };
            assert_eq!(tok.encode(&big, false, special).unwrap(), encode_piece(inner, &big).unwrap());
        }
        // And with a cut at every possible place.
        let small = &big[..8000];
        let pieces = split_at(small, &chunk_ends(small, 1));
        assert!(pieces.len() > 50);
        let joined: Vec<u32> = pieces.iter().flat_map(|p| encode_piece(&tok.with_special, p).unwrap()).collect();
        assert_eq!(joined, encode_piece(&tok.with_special, small).unwrap());
    }
}
