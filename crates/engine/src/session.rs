//! One sequence and its KV cache: prompts fed in micro-batches, then token-by-token decode.

use crate::backend::{Backend, Batch};
use crate::error::{Error, Result};
use crate::kv::KvType;
use crate::muse_glimmer::{MuseGlimmer, Workspace};

/// Which logits a feed returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Every position (teacher forcing), `[n_tokens][n_vocab]`.
    All,
    /// The last position only, `[n_vocab]`.
    Last,
}

pub struct Session<'m, B: Backend> {
    pub model: &'m MuseGlimmer<B>,
    pub kv: B::Kv,
    ws: Option<Workspace<B>>,
    n_ctx: usize,
}

impl<'m, B: Backend> Session<'m, B> {
    pub fn new(model: &'m MuseGlimmer<B>, kv_type: KvType, n_ctx: usize) -> Result<Self> {
        Ok(Session {
            model,
            kv: model.new_cache(kv_type, n_ctx)?,
            ws: None,
            n_ctx,
        })
    }

    /// The position of the next token.
    pub fn pos(&self) -> usize {
        self.model.backend.kv_len(&self.kv)
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn reset(&mut self) {
        self.model.backend.kv_clear(&mut self.kv);
    }

    /// Go back to the first `len` positions, where the cache can continue from there
    /// (`Backend::kv_can_truncate`: every sliding ring still holds the window before `len`);
    /// false, and nothing changed, where it cannot.
    pub fn truncate(&mut self, len: usize) -> bool {
        let ok = self.model.backend.kv_can_truncate(&self.kv, len);
        if ok {
            self.model.backend.kv_set_len(&mut self.kv, len);
        }
        ok
    }

    /// Run `tokens` in micro-batches of at most `ubatch` tokens.
    pub fn feed(&mut self, tokens: &[u32], ubatch: usize, which: Logits) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::Input("no tokens to run".into()));
        }
        if ubatch == 0 {
            return Err(Error::Input("micro-batch size must be at least 1".into()));
        }
        // A micro-batch larger than the backend takes at once (CUDA: 2,048) runs in its largest.
        let ubatch = ubatch.min(self.model.backend.max_batch_tokens().max(1));
        let start = self.pos();
        if start + tokens.len() > self.n_ctx {
            return Err(Error::Input(format!(
                "{} tokens at position {start} exceed the context size {} (at most {} more fit)",
                tokens.len(),
                self.n_ctx,
                self.n_ctx - start
            )));
        }
        let n_vocab = self.model.config.n_vocab;
        let mut out = Vec::with_capacity(if which == Logits::All {
            tokens.len() * n_vocab
        } else {
            n_vocab
        });
        let chunks: Vec<&[u32]> = tokens.chunks(ubatch).collect();
        let need = chunks.iter().map(|c| c.len()).max().unwrap_or(1);
        if self.ws.as_ref().is_none_or(|w| w.max_tokens < need) {
            self.ws = Some(self.model.workspace(need)?);
        }
        let Some(ws) = self.ws.as_mut() else {
            return Err(Error::Backend("no workspace".into()));
        };
        for (ci, chunk) in chunks.iter().enumerate() {
            let batch = Batch::single(chunk, self.model.backend.kv_len(&self.kv) as u32);
            let rows: Vec<usize> = match which {
                Logits::All => (0..chunk.len()).collect(),
                Logits::Last if ci + 1 == chunks.len() => vec![chunk.len() - 1],
                Logits::Last => Vec::new(),
            };
            let l = self.model.forward(ws, &batch, &mut [&mut self.kv], &rows)?;
            out.extend_from_slice(&l);
        }
        Ok(out)
    }

    /// Run `tokens` in one forward and draw a token from each position's logits where they
    /// are (`Backend::draw_rows`; row `i` by `draws[i]`), without bringing the logits to the
    /// host: the ids, `sampling::NOT_FINITE` for a row holding a NaN or an infinity. For a
    /// backend whose `draws_on_device` is true (elsewhere it is the host's draw all the same).
    pub fn feed_drawn(
        &mut self,
        tokens: &[u32],
        draws: &[crate::sampling::RowDraw],
    ) -> Result<Vec<u32>> {
        if tokens.is_empty() || draws.len() != tokens.len() {
            return Err(Error::Input(format!(
                "{} draws for {} tokens: one a token, at least one",
                draws.len(),
                tokens.len()
            )));
        }
        let most = self.model.backend.max_batch_tokens().max(1);
        if tokens.len() > most {
            return Err(Error::Input(format!(
                "{} tokens drawn in one forward: the backend takes at most {most}",
                tokens.len()
            )));
        }
        let start = self.pos();
        if start + tokens.len() > self.n_ctx {
            return Err(Error::Input(format!(
                "{} tokens at position {start} exceed the context size {} (at most {} more fit)",
                tokens.len(),
                self.n_ctx,
                self.n_ctx - start
            )));
        }
        if self.ws.as_ref().is_none_or(|w| w.max_tokens < tokens.len()) {
            self.ws = Some(self.model.workspace(tokens.len())?);
        }
        let Some(ws) = self.ws.as_mut() else {
            return Err(Error::Backend("no workspace".into()));
        };
        let batch = Batch::single(tokens, start as u32);
        let rows: Vec<usize> = (0..tokens.len()).collect();
        self.model
            .forward_device(ws, &batch, &mut [&mut self.kv], &rows)?;
        let mut out = Vec::with_capacity(rows.len());
        self.model.draw_logit_rows(ws, &rows, draws, &mut out)?;
        Ok(out)
    }

    /// Save this sequence's state to `path` (`state`): `tokens` are the tokens its cache holds,
    /// one per position. Returns the bytes written.
    pub fn save_state(&self, path: &std::path::Path, tokens: &[u32]) -> Result<u64> {
        if tokens.len() != self.pos() {
            return Err(Error::Input(format!(
                "saving state: {} tokens for a cache of {} positions",
                tokens.len(),
                self.pos()
            )));
        }
        let image = self.model.backend.kv_export(&self.kv)?;
        let s = crate::state::SavedState {
            fingerprint: self.model.fingerprint,
            made_by: self.model.backend.name(),
            tokens: tokens.to_vec(),
            image,
        };
        crate::state::save(path, &s, self.model.config.n_swa)
    }

    /// Load a state saved from this model (`save_state`), replacing this sequence's cache:
    /// returns its tokens and who computed it. A refused file leaves the cache as it was (a copy
    /// that fails on the device leaves it empty).
    pub fn load_state(&mut self, path: &std::path::Path) -> Result<(Vec<u32>, String)> {
        let s = crate::state::load(path)?;
        if s.fingerprint != self.model.fingerprint {
            return Err(Error::Input(format!(
                "{}: saved from another model (its fingerprint is {:016x}, this model's {:016x})",
                path.display(),
                s.fingerprint,
                self.model.fingerprint
            )));
        }
        if s.tokens
            .iter()
            .any(|&t| t as usize >= self.model.config.n_vocab)
        {
            return Err(Error::Input(format!(
                "{}: a token id outside the vocabulary",
                path.display()
            )));
        }
        self.model.backend.kv_import(&s.image, &mut self.kv)?;
        Ok((s.tokens, s.made_by))
    }
}
