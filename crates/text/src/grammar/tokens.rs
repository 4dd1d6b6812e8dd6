//! A grammar over a vocabulary's tokens, as llama.cpp's grammar sampler applies it
//! (`llama_grammar_apply_impl`, `llama_grammar_accept_impl`): a token is allowed when its piece
//! (control tokens as their text) continues the match; an end-of-generation token only where the
//! match is complete; an empty piece, or one that begins with a NUL, never. A lazy grammar
//! constrains nothing until its trigger is found in the text generated (`grammar_lazy`).

use std::collections::HashMap;
use std::sync::Arc;

use super::gbnf::{Budget, Cand, Grammar, GrammarState, Partial, Texts, decode_piece};
use crate::error::{Result, TextError};
use crate::tokenizer::Tokenizer;

/// Every token's piece and its code points (decoded from a clean start), and which tokens end
/// generation. Built once per tokenizer.
pub struct GrammarVocab {
    pieces: Vec<Box<[u8]>>,
    /// Whether a token may ever be text (not an empty piece, not one that begins with a NUL).
    text: Vec<bool>,
    /// Token i's code points, `cps[start[i]..start[i + 1]]`, and the sequence it leaves cut.
    cps: Vec<u32>,
    start: Vec<u32>,
    partial: Vec<Partial>,
    eog: Vec<bool>,
    instance: u64,
}

impl GrammarVocab {
    pub fn new(tok: &Tokenizer) -> Self {
        let n = tok.n_vocab();
        let mut pieces = Vec::with_capacity(n);
        let mut text = Vec::with_capacity(n);
        let (mut cps, mut start, mut partial) =
            (Vec::new(), Vec::with_capacity(n + 1), Vec::with_capacity(n));
        start.push(0);
        for id in 0..n as u32 {
            let p: Box<[u8]> = tok.piece(id, false).unwrap_or_default().into();
            let ok = p.first().is_some_and(|b| *b != 0);
            let (c, part) = if ok {
                decode_piece(&p, Partial::default())
            } else {
                (Vec::new(), Partial::default())
            };
            cps.extend_from_slice(&c);
            start.push(cps.len() as u32);
            partial.push(part);
            text.push(ok);
            pieces.push(p);
        }
        let mut eog = vec![false; n];
        for id in tok.eog_ids() {
            if let Some(e) = eog.get_mut(id as usize) {
                *e = true;
            }
        }
        GrammarVocab {
            pieces,
            text,
            cps,
            start,
            partial,
            eog,
            instance: tok.instance(),
        }
    }

    /// The pieces decoded from a clean start.
    fn texts(&self) -> Texts<'_> {
        Texts {
            cps: &self.cps,
            start: &self.start,
            partial: &self.partial,
        }
    }

    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The tokenizer this was built from ([`Tokenizer::instance`]).
    pub fn instance(&self) -> u64 {
        self.instance
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.get(id as usize).copied().unwrap_or(false)
    }
}

/// Masks kept per cache (the states of a JSON answer recur: inside a string, between members,
/// and in every answer of the same grammar); past this many the cache starts again.
const MASK_CACHE: usize = 256;

/// States holding more positions than this are not kept as a mask's key (a deep nesting: its
/// key would weigh more than its mask).
const MASK_KEY_POSITIONS: usize = 4096;

/// The masks of one grammar over one vocabulary, by state: shared by every generation that
/// follows the grammar (a server's requests of the same schema meet the same states).
#[derive(Default)]
pub struct MaskCache {
    masks: std::sync::Mutex<HashMap<GrammarState, Arc<[u64]>>>,
}

impl MaskCache {
    fn get(&self, st: &GrammarState) -> Option<Arc<[u64]>> {
        self.masks.lock().ok()?.get(st).cloned()
    }

    fn put(&self, st: &GrammarState, mask: Arc<[u64]>) {
        if let Ok(mut m) = self.masks.lock() {
            if m.len() >= MASK_CACHE {
                m.clear();
            }
            m.insert(st.clone(), mask);
        }
    }
}

/// A grammar and where a generation stands in it.
pub struct Constraint {
    grammar: Arc<Grammar>,
    state: GrammarState,
    masks: Arc<MaskCache>,
    /// A lazy grammar's wait for the text it begins with; None once it constrains.
    awaiting: Option<Awaiting>,
}

/// Where a trigger begins in the text generated so far (the offset the grammar is fed from),
/// None before one is there, resumed from where the last search left the text settled (the
/// offset it moves on): [`super::tool_call_trigger_from`], say.
pub type Trigger = fn(&[u8], &mut usize) -> Option<usize>;

/// A lazy grammar before its trigger (llama.cpp's `awaiting_trigger`): every token is free, and
/// its piece is kept until the trigger is found in them.
struct Awaiting {
    trigger: Trigger,
    text: Vec<u8>,
    /// Where the trigger's next search may start.
    settled: usize,
    /// Each token taken and where its piece begins in `text` (it ends where the next begins).
    tokens: Vec<(u32, usize)>,
}

/// Which ids a bit set holds.
pub fn mask_allows(mask: &[u64], id: u32) -> bool {
    mask.get(id as usize / 64)
        .is_some_and(|w| w >> (id % 64) & 1 == 1)
}

impl Constraint {
    pub fn new(grammar: Arc<Grammar>) -> Self {
        Self::sharing(grammar, Arc::default())
    }

    /// A constraint whose masks go to `masks` (the grammar's, over one vocabulary) and are
    /// taken from there.
    pub fn sharing(grammar: Arc<Grammar>, masks: Arc<MaskCache>) -> Self {
        let state = grammar.start();
        Self::at(grammar, masks, state)
    }

    /// As `sharing`, from `state` (where another constraint of this grammar stood: after its
    /// prefill, say).
    pub fn at(grammar: Arc<Grammar>, masks: Arc<MaskCache>, state: GrammarState) -> Self {
        Constraint {
            grammar,
            state,
            masks,
            awaiting: None,
        }
    }

    /// A lazy constraint (llama.cpp's `llama_sampler_init_grammar_lazy_patterns`): nothing is
    /// constrained until `trigger` finds its text in what was generated; from there the grammar,
    /// from its start, is fed the text from the trigger's offset on (the pieces of the tokens
    /// that reach past it, the first one cut), then constrains every token.
    pub fn lazy(grammar: Arc<Grammar>, masks: Arc<MaskCache>, trigger: Trigger) -> Self {
        let mut c = Self::sharing(grammar, masks);
        c.awaiting = Some(Awaiting {
            trigger,
            text: Vec::new(),
            settled: 0,
            tokens: Vec::new(),
        });
        c
    }

    /// Whether the grammar constrains the next token (a lazy one: once its trigger was found).
    pub fn constrains(&self) -> bool {
        self.awaiting.is_none()
    }

    /// Where the match stands.
    pub fn state(&self) -> &GrammarState {
        &self.state
    }

    /// Text the prompt already holds, matched before anything is generated (llama.cpp feeds the
    /// chat format's generation prompt to the grammar so).
    pub fn prefill(&mut self, text: &[u8]) -> Result<()> {
        self.state = self
            .grammar
            .accept_piece(&self.state, text)?
            .ok_or_else(|| {
                TextError::Grammar(format!(
                    "the grammar does not accept the generation prompt {:?}",
                    String::from_utf8_lossy(text)
                ))
            })?;
        Ok(())
    }

    pub fn is_complete(&self) -> bool {
        self.state.is_complete()
    }

    /// Whether token `id` may come next (an error: the grammar is too ambiguous to follow).
    pub fn allows(&self, v: &GrammarVocab, id: u32) -> Result<bool> {
        if !self.constrains() {
            return Ok(true);
        }
        let i = id as usize;
        if v.is_eog(id) {
            return Ok(self.state.is_complete());
        }
        if !v.text.get(i).copied().unwrap_or(false) {
            return Ok(false);
        }
        let mut budget = Budget::new();
        Ok(if self.state.partial.n_remain() == 0 {
            let cps = &v.cps[v.start[i] as usize..v.start[i + 1] as usize];
            self.grammar
                .allows(&self.state, cps, v.partial[i], &mut budget)?
        } else {
            let (cps, partial) = decode_piece(&v.pieces[i], self.state.partial);
            self.grammar
                .allows(&self.state, &cps, partial, &mut budget)?
        })
    }

    /// The tokens that may come next, as a bit set over the vocabulary (kept for this state; an
    /// error: the grammar is too ambiguous to follow).
    pub fn allowed(&mut self, v: &GrammarVocab) -> Result<Arc<[u64]>> {
        let n = v.len();
        if !self.constrains() {
            let mut all = vec![u64::MAX; n.div_ceil(64)];
            if let Some(last) = all.last_mut()
                && !n.is_multiple_of(64)
            {
                *last = (1u64 << (n % 64)) - 1;
            }
            return Ok(all.into());
        }
        if let Some(m) = self.masks.get(&self.state) {
            return Ok(m);
        }
        let mut mask = vec![0u64; n.div_ceil(64)];
        let complete = self.state.is_complete();
        // With a character cut, every piece is decoded again as its continuation.
        let redecoded = (self.state.partial.n_remain() != 0).then(|| {
            let (mut cps, mut start, mut partial) = (Vec::new(), vec![0u32], Vec::with_capacity(n));
            for i in 0..n {
                let (c, p) = if v.text[i] {
                    decode_piece(&v.pieces[i], self.state.partial)
                } else {
                    (Vec::new(), Partial::default())
                };
                cps.extend_from_slice(&c);
                start.push(cps.len() as u32);
                partial.push(p);
            }
            (cps, start, partial)
        });
        let texts = match &redecoded {
            Some((cps, start, partial)) => Texts {
                cps,
                start,
                partial,
            },
            None => v.texts(),
        };
        let mut cands = Vec::with_capacity(n);
        for id in 0..n {
            if v.eog[id] {
                if complete {
                    mask[id / 64] |= 1 << (id % 64);
                }
            } else if v.text[id] {
                cands.push(Cand::new(&texts, id as u32));
                mask[id / 64] |= 1 << (id % 64);
            }
        }
        let mut budget = Budget::new();
        for r in self
            .grammar
            .reject(&texts, &self.state.stacks, &cands, &mut budget)?
        {
            mask[r.id as usize / 64] &= !(1 << (r.id % 64));
        }
        let mask: Arc<[u64]> = mask.into();
        if self.state.stacks.iter().map(Vec::len).sum::<usize>() <= MASK_KEY_POSITIONS {
            self.masks.put(&self.state, mask.clone());
        }
        Ok(mask)
    }

    /// Take token `id` (one [`Constraint::allows`]): the match moves past its piece; an
    /// end-of-generation token leaves it where it is.
    pub fn accept(&mut self, v: &GrammarVocab, id: u32) -> Result<()> {
        if let Some(a) = &mut self.awaiting {
            let piece = v.pieces.get(id as usize).map_or(&[][..], |p| &p[..]);
            a.tokens.push((id, a.text.len()));
            a.text.extend_from_slice(piece);
            let Some(from) = (a.trigger)(&a.text, &mut a.settled) else {
                return Ok(());
            };
            let Some(a) = self.awaiting.take() else {
                return Ok(());
            };
            // The tokens whose pieces reach past the trigger's start, fed as
            // `llama_grammar_accept_token` is in the replay (an end-of-generation token's piece
            // as text).
            for (k, &(tid, begin)) in a.tokens.iter().enumerate() {
                let end = a.tokens.get(k + 1).map_or(a.text.len(), |t| t.1);
                if end <= from {
                    continue;
                }
                let piece = &a.text[begin.max(from)..end];
                self.state = self.grammar.accept_piece(&self.state, piece)?.ok_or_else(|| {
                    TextError::Grammar(format!(
                        "the grammar does not accept the text it is triggered by, at token {tid}: {:?}",
                        String::from_utf8_lossy(&a.text[from..])
                    ))
                })?;
            }
            return Ok(());
        }
        let refused = || TextError::Grammar(format!("token {id} does not continue the grammar"));
        if v.is_eog(id) {
            return if self.state.is_complete() {
                Ok(())
            } else {
                Err(refused())
            };
        }
        if !v.text.get(id as usize).copied().unwrap_or(false) {
            return Err(refused());
        }
        self.state = self
            .grammar
            .accept_piece(&self.state, &v.pieces[id as usize])?
            .ok_or_else(refused)?;
        Ok(())
    }
}
