//! Muse Glimmer: the weights and the forward pass, written once against [`Backend`].
//!
//! Read it beside llama.cpp b11434's `src/models/muse-glimmer.cpp` and transformers 5.24.0's
//! `models/muse_glimmer/modeling_muse_glimmer.py`; each step names the anchor's tensor.
//!
//! ```text
//! x = rms_norm(token_embd[tokens], eps)                 embd_norm: scaleless entry norm
//! for each layer:
//!     h = rms_norm(x, eps) * attn_norm                   attn_norm (1 + w folded at conversion)
//!     q, k, v, g = h Wq, h Wk, h Wv, h Wgate             gate from the same normed input
//!     q = rms_norm_per_head(q, eps) * qk_scale           Qcur_normed (q_norm: constant broadcast)
//!     k = rms_norm_per_head(k, eps)                      Kcur_normed (k_norm: ones)
//!     sliding layers: q, k = rope(q), rope(k)            NORM pairs; NoPE on full layers
//!     a = attention(q, k, v, 1/sqrt(head_dim), window)   attn_out
//!     o = (a * sigmoid(g)) Wo                            attn_gated, attn_o_proj
//!     x = x + rms_norm(o, 1e-8) * post_attention_norm    ffn_inp
//!     h = rms_norm(x, eps) * ffn_norm                    ffn_norm
//!     f = (silu(h Wgate_ffn) * h Wup) Wdown              ffn_out
//!     x = x + rms_norm(f, 1e-8) * post_ffw_norm          l_out
//! logits = softcap * tanh((rms_norm(x, eps) * output_norm) Wout * logit_scale / softcap)
//! ```

use std::sync::Arc;

use muser_gguf::Gguf;

use crate::backend::{AttnSpec, Backend, Batch, QkSpec, StepRecord};
use crate::config::{MuseConfig, POST_NORM_EPS};
use crate::error::{Error, Result};
use crate::kv::KvType;
use crate::loader::{LayerTensors, ModelFile};

/// One decoder layer's weights, resident in the backend.
pub struct Layer<B: Backend> {
    pub attn_norm: B::Vector,           // [n_embd]
    pub attn_q: B::Matrix,              // [n_head*head_dim][n_embd]
    pub attn_k: B::Matrix,              // [n_head_kv*head_dim][n_embd]
    pub attn_v: B::Matrix,              // [n_head_kv*head_dim][n_embd]
    pub attn_gate: B::Matrix,           // [n_head*head_dim][n_embd]
    pub attn_output: B::Matrix,         // [n_embd][n_head*head_dim]
    pub qk_scale: f32,                  // attn_q_norm's constant (qk_scale_factor)
    pub post_attention_norm: B::Vector, // [n_embd]
    pub ffn_norm: B::Vector,            // [n_embd]
    pub ffn_gate: B::Matrix,            // [n_ff][n_embd]
    pub ffn_up: B::Matrix,              // [n_ff][n_embd]
    pub ffn_down: B::Matrix,            // [n_embd][n_ff]
    pub post_ffw_norm: B::Vector,       // [n_embd]
}

/// A callback that sees intermediate tensors of the forward pass (`MuseGlimmer::set_tap`):
/// llama.cpp's graph name (`attn_norm-0`, `l_out-2`, `result_output`, ...) and the tensor's
/// values, row-major `[tokens][width]`.
pub type Tap = Box<dyn Fn(&str, &[f32]) + Send + Sync>;

/// The model: configuration, weights, backend.
pub struct MuseGlimmer<B: Backend> {
    pub config: MuseConfig,
    pub backend: B,
    pub token_embd: B::Matrix,  // [n_vocab][n_embd]
    pub output_norm: B::Vector, // [n_embd]
    pub output: B::Matrix,      // [n_vocab][n_embd]
    pub layers: Vec<Layer<B>>,
    /// The file's identity for saved sequence state (`state::fingerprint`).
    pub fingerprint: u64,
    tap: std::sync::OnceLock<Tap>,
}

impl<B: Backend> MuseGlimmer<B> {
    /// Place a validated model file's weights on `backend`.
    pub fn load(file: &ModelFile, backend: B) -> Result<Self> {
        Self::load_with_progress(file, backend, &mut |_, _| {})
    }

    /// As [`MuseGlimmer::load`], calling `progress(done, total)` after each layer.
    pub fn load_with_progress(
        file: &ModelFile,
        backend: B,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let g: &Arc<Gguf> = &file.gguf;
        let t = &file.tensors;
        let n = t.layers.len();
        let fingerprint = crate::state::fingerprint(g, &file.config);
        let token_embd = backend.matrix(g, &t.token_embd)?;
        let output_norm = backend.vector(&t.output_norm)?;
        let output = backend.matrix(g, &t.output)?;
        let mut layers = Vec::with_capacity(n);
        for (i, l) in t.layers.iter().enumerate() {
            layers.push(Self::load_layer(&backend, g, l)?);
            progress(i + 1, n);
        }
        Ok(MuseGlimmer {
            config: file.config.clone(),
            backend,
            token_embd,
            output_norm,
            output,
            layers,
            fingerprint,
            tap: std::sync::OnceLock::new(),
        })
    }

    /// Show every later forward pass's intermediate tensors to `tap` (once per model): where a
    /// backend's result first departs from another's (llama.cpp's `cb_eval` dumps carry the
    /// same names; the fused attention shows only its gated output). Each tapped tensor is
    /// copied to the host, and no step is recorded for replay once a tap is set.
    pub fn set_tap(&self, tap: Tap) -> Result<()> {
        self.tap
            .set(tap)
            .map_err(|_| Error::Input("this model already has a tap".into()))
    }

    /// Whether a tap is set (a caller recording whole steps itself must then run them eagerly).
    pub fn tapped(&self) -> bool {
        self.tap.get().is_some()
    }

    fn show(&self, name: &str, il: Option<usize>, a: &B::Act) -> Result<()> {
        if let Some(tap) = self.tap.get() {
            let v = self.backend.read(a)?;
            match il {
                Some(il) => tap(&format!("{name}-{il}"), &v),
                None => tap(name, &v),
            }
        }
        Ok(())
    }

    fn load_layer(b: &B, g: &Arc<Gguf>, l: &LayerTensors) -> Result<Layer<B>> {
        Ok(Layer {
            attn_norm: b.vector(&l.attn_norm)?,
            attn_q: b.matrix(g, &l.attn_q)?,
            attn_k: b.matrix(g, &l.attn_k)?,
            attn_v: b.matrix(g, &l.attn_v)?,
            attn_gate: b.matrix(g, &l.attn_gate)?,
            attn_output: b.matrix(g, &l.attn_output)?,
            qk_scale: l.qk_scale,
            post_attention_norm: b.vector(&l.post_attention_norm)?,
            ffn_norm: b.vector(&l.ffn_norm)?,
            ffn_gate: b.matrix(g, &l.ffn_gate)?,
            ffn_up: b.matrix(g, &l.ffn_up)?,
            ffn_down: b.matrix(g, &l.ffn_down)?,
            post_ffw_norm: b.vector(&l.post_ffw_norm)?,
        })
    }

    /// A KV cache for one sequence of at most `n_ctx` positions.
    pub fn new_cache(&self, ty: KvType, n_ctx: usize) -> Result<B::Kv> {
        if n_ctx == 0 || n_ctx > self.config.n_ctx_train {
            return Err(Error::Input(format!(
                "context size {n_ctx} is outside 1..={} (the model's context_length)",
                self.config.n_ctx_train
            )));
        }
        self.backend.kv_cache(&self.config, ty, n_ctx)
    }

    fn check_batch(&self, batch: &Batch, caches: &[&mut B::Kv]) -> Result<()> {
        if batch.is_empty() || batch.pos.len() != batch.len() || batch.seq.len() != batch.len() {
            return Err(Error::Input("empty or inconsistent batch".into()));
        }
        if let Some(&t) = batch
            .tokens
            .iter()
            .find(|&&t| t as usize >= self.config.n_vocab)
        {
            return Err(Error::Input(format!(
                "token id {t} is outside the vocabulary (size {})",
                self.config.n_vocab
            )));
        }
        let mut next: Vec<Option<u32>> = vec![None; caches.len()];
        for i in 0..batch.len() {
            let s = batch.seq[i];
            let Some(cache) = caches.get(s) else {
                return Err(Error::Input(format!(
                    "batch token {i} names sequence {s}, but {} caches were given",
                    caches.len()
                )));
            };
            let want = next[s].unwrap_or(self.backend.kv_len(cache) as u32);
            if batch.pos[i] != want {
                return Err(Error::Input(format!(
                    "sequence {s}: token {i} is at position {}, expected {want} (positions must continue the cache)",
                    batch.pos[i]
                )));
            }
            if want as usize >= self.backend.kv_capacity(cache) {
                return Err(Error::Input(format!(
                    "sequence {s}: position {want} is past the context size {}",
                    self.backend.kv_capacity(cache)
                )));
            }
            next[s] = Some(want + 1);
        }
        Ok(())
    }

    /// Activation buffers for micro-batches of up to `max_tokens` tokens, reused across
    /// forward passes (a captured CUDA graph replays on the same buffers).
    pub fn workspace(&self, max_tokens: usize) -> Result<Workspace<B>> {
        Workspace::new(&self.backend, &self.config, max_tokens)
    }

    /// Run one micro-batch through the model, store its K/V in `caches`, and return the
    /// logits of the batch rows listed in `logit_rows`, row-major `[logit_rows.len()][n_vocab]`.
    pub fn forward(
        &self,
        ws: &mut Workspace<B>,
        batch: &Batch,
        caches: &mut [&mut B::Kv],
        logit_rows: &[usize],
    ) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        self.forward_into(ws, batch, caches, logit_rows, &mut out)?;
        Ok(out)
    }

    /// As [`MuseGlimmer::forward`], the logits written into `out` (its memory reused).
    pub fn forward_into(
        &self,
        ws: &mut Workspace<B>,
        batch: &Batch,
        caches: &mut [&mut B::Kv],
        logit_rows: &[usize],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.forward_device(ws, batch, caches, logit_rows)?;
        if logit_rows.is_empty() {
            out.clear();
            return Ok(());
        }
        self.backend.read_into(&ws.logits, out)
    }

    /// After `forward_device`: rows `rows` of its logits (indexes into its `logit_rows`) on
    /// the host, row-major `[rows.len()][n_vocab]` in `out` (its memory reused).
    pub fn read_logit_rows(
        &self,
        ws: &Workspace<B>,
        rows: &[usize],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.backend
            .read_rows_into(&ws.logits, self.config.n_vocab, rows, out)
    }

    /// After `forward_device`: token `targets[i]`'s log-probability under row `rows[i]` of its
    /// logits and the row's `tops[i]` most likely tokens (`Backend::row_logprobs`).
    pub fn logit_row_logprobs(
        &self,
        ws: &Workspace<B>,
        rows: &[usize],
        targets: &[u32],
        tops: &[usize],
        out: &mut Vec<crate::sampling::RowLogprob>,
    ) -> Result<()> {
        self.backend
            .row_logprobs(&ws.logits, self.config.n_vocab, rows, targets, tops, out)
    }

    /// After `forward_device`: a token for each of rows `rows` of its logits, chosen by
    /// `draws` where the logits are (`Backend::draw_rows`; the logits stay as they are).
    pub fn draw_logit_rows(
        &self,
        ws: &mut Workspace<B>,
        rows: &[usize],
        draws: &[crate::sampling::RowDraw],
        out: &mut Vec<u32>,
    ) -> Result<()> {
        self.backend
            .draw_rows(&mut ws.logits, self.config.n_vocab, rows, draws, out)
    }

    /// As [`MuseGlimmer::forward`], leaving the logits in `ws.logits` on the backend.
    pub fn forward_device(
        &self,
        ws: &mut Workspace<B>,
        batch: &Batch,
        caches: &mut [&mut B::Kv],
        logit_rows: &[usize],
    ) -> Result<()> {
        self.check_batch(batch, caches)?;
        if batch.len() > ws.max_tokens || logit_rows.len() > ws.max_tokens {
            return Err(Error::Input(format!(
                "a micro-batch of {} tokens exceeds the workspace ({})",
                batch.len(),
                ws.max_tokens
            )));
        }
        // Every row's logits: a step a backend may record once and replay (CUDA graphs).
        let all_rows = every_row(batch, logit_rows);
        let mode = if all_rows && self.tap.get().is_none() {
            self.backend.step_record(batch, caches, ws.id)?
        } else {
            StepRecord::Eager
        };
        match mode {
            StepRecord::Eager => {
                let run = self
                    .backend
                    .run_ops(&mut || self.forward_ops(ws, batch, caches, logit_rows));
                if all_rows {
                    self.backend.step_ran(run.is_ok());
                }
                run
            }
            StepRecord::Replay => {
                self.backend.record_replay(batch, caches)?;
                ws.set_rows(&self.backend, batch.len(), logit_rows.len())?;
                self.set_cache_lengths(batch, caches);
                Ok(())
            }
            StepRecord::Record => {
                self.backend.record_begin(batch, caches)?;
                let run = self.forward_ops(ws, batch, caches, logit_rows);
                if self.backend.record_end(run.is_ok())? {
                    return Ok(());
                }
                // Nothing ran while recording (or the recording failed): run the step now.
                self.forward_ops(ws, batch, caches, logit_rows)
            }
        }
    }

    /// Each cache's stored length after `batch` (host bookkeeping; a replayed step needs it too).
    fn set_cache_lengths(&self, batch: &Batch, caches: &mut [&mut B::Kv]) {
        for (s, cache) in caches.iter_mut().enumerate() {
            if let Some(last) = (0..batch.len()).rev().find(|&i| batch.seq[i] == s) {
                self.backend.kv_set_len(cache, batch.pos[last] as usize + 1);
            }
        }
    }

    /// The operations of a forward pass (`batch` validated by the caller).
    fn forward_ops(
        &self,
        ws: &mut Workspace<B>,
        batch: &Batch,
        caches: &mut [&mut B::Kv],
        logit_rows: &[usize],
    ) -> Result<()> {
        let c = &self.config;
        let b = &self.backend;
        let eps = c.rms_eps;
        ws.set_rows(b, batch.len(), logit_rows.len())?;
        let Workspace {
            e,
            x,
            h,
            q,
            k,
            v,
            g,
            a,
            o,
            fg,
            fu,
            f,
            sel,
            logits,
            ..
        } = ws;
        b.begin_batch(batch)?;

        // inp_embd, embd_norm: the scaleless entry norm.
        b.get_rows(&self.token_embd, &batch.tokens, e)?;
        b.rms_norm(e, None, eps, x)?;
        self.show("embd_norm", None, x)?;
        b.rms_norm(x, Some(&self.layers[0].attn_norm), eps, h)?;

        for (il, l) in self.layers.iter().enumerate() {
            let kind = c.layer_kinds[il];
            self.show("attn_norm", Some(il), h)?;
            // Projections from the pre-normed stream; the gate reads the same input.
            b.matmul_group(
                &[&l.attn_q, &l.attn_gate, &l.attn_k, &l.attn_v],
                h,
                &mut [&mut *q, &mut *g, &mut *k, &mut *v],
            )?;
            for (name, t) in [
                ("Qcur", &*q),
                ("Kcur", &*k),
                ("Vcur", &*v),
                ("attn_gate_proj", &*g),
            ] {
                self.show(name, Some(il), t)?;
            }
            let spec = AttnSpec {
                layer: il,
                kind,
                n_swa: c.n_swa,
                scale: c.kq_scale(),
                n_head: c.n_head,
                n_head_kv: c.n_head_kv,
                head_dim: c.head_dim,
            };
            // QK-norm per head (eps from the GGUF, q scaled by the probed constant), RoPE on
            // sliding layers only, then a = attention(q, k, v) * sigmoid(g): the output gate.
            let qk = QkSpec {
                eps,
                q_scale: l.qk_scale,
                rope_base: kind.uses_rope().then_some(c.rope_freq_base_swa),
            };
            b.attend(caches, spec, qk, batch, q, k, v, g, a)?;
            self.show("attn_gated", Some(il), a)?;
            b.matmul(&l.attn_output, a, o)?;
            self.show("attn_o_proj", Some(il), o)?;

            // inp_out_ids: the last layer continues with the rows whose logits are wanted only
            // (llama.cpp selects them here, and its matrix products depend on the row count).
            let (xc, oc) = if il + 1 == self.layers.len() && !every_row(batch, logit_rows) {
                if logit_rows.is_empty() {
                    // Nothing past this point touches the caches.
                    break;
                }
                let m = logit_rows.len();
                for t in [&mut *e, &mut *sel, &mut *h, &mut *fg, &mut *fu, &mut *f] {
                    b.set_rows(t, m)?;
                }
                b.select_rows(x, logit_rows, e)?;
                b.select_rows(o, logit_rows, sel)?;
                (&mut *e, &mut *sel)
            } else {
                (&mut *x, &mut *o)
            };
            // x += rms_norm(o, 1e-8) * post_attention_norm; h = rms_norm(x, eps) * ffn_norm.
            b.norm_tail(
                xc,
                oc,
                &l.post_attention_norm,
                POST_NORM_EPS,
                &l.ffn_norm,
                eps,
                h,
            )?;
            self.show("ffn_inp", Some(il), xc)?;
            self.show("ffn_norm", Some(il), h)?;

            // SwiGLU feed-forward.
            b.ffn_swiglu(&l.ffn_gate, &l.ffn_up, h, fg, fu, f)?;
            b.matmul(&l.ffn_down, f, oc)?;
            self.show("ffn_out", Some(il), oc)?;
            // x += rms_norm(f, 1e-8) * post_ffw_norm; h = the next layer's attn_norm, or the final norm.
            let next_norm = self
                .layers
                .get(il + 1)
                .map_or(&self.output_norm, |nl| &nl.attn_norm);
            b.norm_tail(xc, oc, &l.post_ffw_norm, POST_NORM_EPS, next_norm, eps, h)?;
            self.show("l_out", Some(il), xc)?;
        }
        self.set_cache_lengths(batch, caches);
        if logit_rows.is_empty() {
            return Ok(());
        }
        // result_norm: h holds the wanted rows; lm_head, logit scale, softcap.
        self.show("result_norm", None, h)?;
        b.matmul(&self.output, h, logits)?;
        b.logit_finish(logits, c.logit_scale, c.softcap)?;
        self.show("result_output", None, logits)
    }
}

/// Whether `logit_rows` names every row of `batch`, in order.
fn every_row(batch: &Batch, logit_rows: &[usize]) -> bool {
    logit_rows.len() == batch.len() && logit_rows.iter().enumerate().all(|(i, &r)| i == r)
}

/// The activation buffers of a forward pass.
pub struct Workspace<B: Backend> {
    /// Unique in the process: a recorded step (a CUDA graph) belongs to one workspace's buffers.
    pub id: u64,
    pub max_tokens: usize,
    pub e: B::Act, // [n][n_embd] token embeddings; at the last layer, the selected residual rows
    pub x: B::Act, // [n][n_embd] the residual stream
    pub h: B::Act, // [n][n_embd] the normed stream
    pub q: B::Act, // [n][n_head*head_dim]
    pub k: B::Act, // [n][n_head_kv*head_dim]
    pub v: B::Act, // [n][n_head_kv*head_dim]
    pub g: B::Act, // [n][n_head*head_dim] attention gate
    pub a: B::Act, // [n][n_head*head_dim] attention output
    pub o: B::Act, // [n][n_embd] block outputs
    pub fg: B::Act, // [n][n_ff]
    pub fu: B::Act, // [n][n_ff]
    pub f: B::Act, // [n][n_ff]
    pub sel: B::Act, // [rows][n_embd] the last layer's attention output, rows whose logits are wanted
    pub logits: B::Act, // [rows][n_vocab]
}

impl<B: Backend> Workspace<B> {
    pub fn new(b: &B, c: &MuseConfig, n: usize) -> Result<Self> {
        if n == 0 {
            return Err(Error::Input(
                "a workspace needs room for at least one token".into(),
            ));
        }
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(Workspace {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            max_tokens: n,
            e: b.act(n, c.n_embd)?,
            x: b.act(n, c.n_embd)?,
            h: b.act(n, c.n_embd)?,
            q: b.act(n, c.q_dim())?,
            k: b.act(n, c.kv_dim())?,
            v: b.act(n, c.kv_dim())?,
            g: b.act(n, c.q_dim())?,
            a: b.act(n, c.q_dim())?,
            o: b.act(n, c.n_embd)?,
            fg: b.act(n, c.n_ff)?,
            fu: b.act(n, c.n_ff)?,
            f: b.act(n, c.n_ff)?,
            sel: b.act(n, c.n_embd)?,
            logits: b.act(n, c.n_vocab)?,
        })
    }

    fn set_rows(&mut self, b: &B, n: usize, rows: usize) -> Result<()> {
        for a in [
            &mut self.e,
            &mut self.x,
            &mut self.h,
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.g,
            &mut self.a,
            &mut self.o,
            &mut self.fg,
            &mut self.fu,
            &mut self.f,
        ] {
            b.set_rows(a, n)?;
        }
        b.set_rows(&mut self.sel, rows)?;
        b.set_rows(&mut self.logits, rows)
    }
}
