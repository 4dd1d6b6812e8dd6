//! The GGUF's byte-level BPE, encoding and decoding exactly as the model's HF tokenizer does.
//!
//! The pipeline is that of Llama-4's tokenizer.json as HF tokenizers runs it: added tokens are
//! cut out first (special ones only when special parsing is on), the rest is split by the
//! pre-tokenizer regex (src/pretokenize.rs), and each piece goes through byte-level BPE
//! (src/bpe.rs). Decoding is a table of each token's bytes, computed with HF's ByteLevel decoder
//! rule, so that whole and streamed decoding give the same bytes.

use std::path::Path;

use aho_corasick::{AhoCorasick, MatchKind};
use muser_gguf::Gguf;

use crate::bpe::Bpe;
use crate::byte_level::token_bytes;
use crate::error::{Result, TextError};
use crate::pretokenize::WhitespaceLookaheadSplit;
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

static NEXT_INSTANCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A byte-level BPE tokenizer built from a GGUF vocabulary.
pub struct Tokenizer {
    vocab: Vocab,
    bpe: Bpe,
    split: WhitespaceLookaheadSplit,
    /// Control tokens (HF special, `normalized=false`): cut out first, and only with special parsing.
    control: AddedTokens,
    /// User-defined tokens (HF added, not special): cut out of what is left, always.
    user_defined: AddedTokens,
    /// `bytes[offsets[i]..offsets[i + 1]]` is what token `i` decodes to.
    bytes: Vec<u8>,
    offsets: Vec<usize>,
    max_input_bytes: usize,
    /// This tokenizer among the process's (`instance`): what is built from its vocabulary
    /// elsewhere (a template's `Sanitizer`) is kept under it.
    instance: u64,
}

impl Tokenizer {
    /// Reads the GGUF at `path` and builds its tokenizer.
    pub fn from_gguf_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let g = Gguf::open(path).map_err(|e| TextError::Io {
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
        Self::from_gguf(&g)
    }

    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        Self::from_vocab(Vocab::from_gguf(g)?)
    }

    /// The merges are consumed into the BPE tables (`vocab().merges` is empty afterwards).
    pub fn from_vocab(mut vocab: Vocab) -> Result<Self> {
        let n = vocab.tokens.len();
        // Every token but the [PADn] fillers is visible to BPE (HF's model vocabulary; merges can
        // only reach ordinary tokens anyway).
        let visible: Vec<(&str, u32)> = vocab
            .tokens
            .iter()
            .zip(&vocab.types)
            .enumerate()
            .filter(|(_, (_, ty))| **ty != TokenType::Unused)
            .map(|(id, (t, _))| (t.as_str(), id as u32))
            .collect();
        // llama-vocab.cpp sets ignore_merges for llama-bpe only; Llama-4 runs every merge.
        let bpe = Bpe::new(&visible, &vocab.merges, vocab.pre == PreTokenizer::Llama3)?;
        drop(visible);
        vocab.merges = Vec::new();
        let regex = match vocab.pre {
            PreTokenizer::Llama4 => LLAMA4_REGEX,
            PreTokenizer::Llama3 => LLAMA3_REGEX,
        };
        let split = WhitespaceLookaheadSplit::new(regex)?;
        // The converter's mapping (conversion/base.py get_vocab_base), reversed.
        let control = AddedTokens::new(&vocab, TokenType::Control)?;
        let user_defined = AddedTokens::new(&vocab, TokenType::UserDefined)?;

        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        for (t, ty) in vocab.tokens.iter().zip(&vocab.types) {
            if *ty != TokenType::Unused {
                bytes.extend_from_slice(&token_bytes(t));
            }
            offsets.push(bytes.len());
        }
        Ok(Self {
            vocab,
            bpe,
            split,
            control,
            user_defined,
            bytes,
            offsets,
            max_input_bytes: DEFAULT_MAX_INPUT_BYTES,
            instance: NEXT_INSTANCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// Token ids of `text`. `add_bos` prepends BOS (the CLI passes `add_bos_default() && !no_bos`).
    /// With `parse_special` the control tokens written in the text ("<|eot|>") become their ids, as a
    /// rendered chat template needs; without it they are plain text, so user input cannot inject
    /// them. User-defined added tokens are atomic either way, as in HF.
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<u32>> {
        if text.len() > self.max_input_bytes {
            return Err(TextError::InputTooLarge {
                len: text.len(),
                limit: self.max_input_bytes,
            });
        }
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            ids.push(self.vocab.bos.ok_or_else(|| {
                TextError::Vocab(
                    "BOS was asked for but the GGUF has no tokenizer.ggml.bos_token_id".into(),
                )
            })?);
        }
        self.encode_piece(text, parse_special, &mut ids);
        Ok(ids)
    }

    /// Token ids of `text` with no added token matched at all, control or user-defined: split
    /// and BPE only (transformers' `_encode_without_added_tokens`, which its sanitized chats use
    /// for a control token written in user text).
    pub fn encode_without_added(&self, text: &str) -> Result<Vec<u32>> {
        if text.len() > self.max_input_bytes {
            return Err(TextError::InputTooLarge {
                len: text.len(),
                limit: self.max_input_bytes,
            });
        }
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        for (s, e) in self.split.matches(text) {
            self.bpe.encode_word(&text.as_bytes()[s..e], &mut ids);
        }
        Ok(ids)
    }

    /// [`encode`](Self::encode) for raw bytes: invalid UTF-8 is an error naming the offset.
    pub fn encode_bytes(
        &self,
        bytes: &[u8],
        add_bos: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>> {
        let text = std::str::from_utf8(bytes).map_err(|e| TextError::InvalidUtf8 {
            offset: e.valid_up_to(),
        })?;
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
            return Err(TextError::UnknownToken {
                id: id.into(),
                n_vocab: self.vocab.tokens.len(),
            });
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
            .map(|&i| {
                u32::try_from(i)
                    .ok()
                    .filter(|&u| (u as usize) < n)
                    .ok_or(TextError::UnknownToken { id: i, n_vocab: n })
            })
            .collect()
    }

    /// The id of the token whose GGUF string is `token` ("<|eot|>", "Ġthe"); the first if repeated.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.vocab
            .tokens
            .iter()
            .position(|t| t == token)
            .map(|i| i as u32)
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
        let mut v: Vec<u32> = [self.vocab.eos, self.vocab.eot, self.vocab.eom]
            .into_iter()
            .flatten()
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// `tokenizer.ggml.add_bos_token`: whether a plain prompt should start with BOS.
    pub fn add_bos_default(&self) -> bool {
        self.vocab.add_bos
    }

    /// A number no other tokenizer of this process has (its vocabulary never changes).
    pub fn instance(&self) -> u64 {
        self.instance
    }

    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    pub fn set_max_input_bytes(&mut self, limit: usize) {
        self.max_input_bytes = limit;
    }
}

impl Tokenizer {
    /// Added tokens first (HF `AddedVocabulary::extract_and_normalize`: control tokens, then
    /// user-defined ones in what is left), then split and BPE.
    fn encode_piece(&self, text: &str, parse_special: bool, out: &mut Vec<u32>) {
        let control = if parse_special {
            Some(&self.control)
        } else {
            None
        };
        for (seg, id) in AddedTokens::cut(control, text) {
            if let Some(id) = id {
                out.push(id);
                continue;
            }
            for (seg, id) in AddedTokens::cut(Some(&self.user_defined), seg) {
                if let Some(id) = id {
                    out.push(id);
                    continue;
                }
                for (s, e) in self.split.matches(seg) {
                    self.bpe.encode_word(&seg.as_bytes()[s..e], out);
                }
            }
        }
    }
}

/// One kind of added token, found in text leftmost-longest (HF builds its tries with
/// `MatchKind::LeftmostLongest`).
struct AddedTokens {
    matcher: Option<AhoCorasick>,
    ids: Vec<u32>,
}

impl AddedTokens {
    fn new(vocab: &Vocab, kind: TokenType) -> Result<Self> {
        let mut ids = Vec::new();
        let mut texts = Vec::new();
        for (i, (t, ty)) in vocab.tokens.iter().zip(&vocab.types).enumerate() {
            if *ty == kind && !t.is_empty() {
                ids.push(i as u32);
                texts.push(t.clone());
            }
        }
        let matcher = if texts.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(&texts)
                    .map_err(|e| TextError::Tokenizer(format!("added tokens: {e}")))?,
            )
        };
        Ok(Self { matcher, ids })
    }

    /// `text` cut into plain pieces (`None`) and added tokens (`Some(id)`); `None` as the table
    /// (special parsing off) leaves the text whole.
    fn cut<'a>(table: Option<&Self>, text: &'a str) -> Vec<(&'a str, Option<u32>)> {
        let Some(m) = table.and_then(|t| t.matcher.as_ref().map(|m| (t, m))) else {
            return vec![(text, None)];
        };
        let (table, matcher) = m;
        let mut out = Vec::new();
        let mut prev = 0;
        for hit in matcher.find_iter(text) {
            if hit.start() > prev {
                out.push((&text[prev..hit.start()], None));
            }
            out.push((
                &text[hit.start()..hit.end()],
                Some(table.ids[hit.pattern().as_usize()]),
            ));
            prev = hit.end();
        }
        if prev < text.len() {
            out.push((&text[prev..], None));
        }
        out
    }
}
