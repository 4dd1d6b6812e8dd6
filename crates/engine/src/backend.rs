//! The backend boundary: the eager operations the model is written against.
//!
//! The model (`model.rs`) is written once; a backend (CPU here, CUDA later) implements these
//! operations on its own buffers. Activations are row-major f32 matrices, one row per token
//! of the micro-batch. Fused operations have a plain default composed of the unfused ones,
//! which is their reference.

use std::sync::Arc;

use muser_gguf::Gguf;

use crate::config::{LayerKind, MuseConfig};
use crate::error::{Error, Result};
use crate::kv::KvType;
use crate::loader::Matrix;
use crate::sampling::RowDraw;

/// The tokens of one micro-batch: token `i` is `tokens[i]` at position `pos[i]` of sequence
/// `seq[i]` (an index into the caches passed to `attention`). Within a sequence, positions are
/// consecutive and follow that sequence's cached positions.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub pos: Vec<u32>,
    pub seq: Vec<usize>,
}

impl Batch {
    /// A batch of one sequence: `tokens` at positions `start..`.
    pub fn single(tokens: &[u32], start: u32) -> Self {
        Batch {
            tokens: tokens.to_vec(),
            pos: (0..tokens.len() as u32).map(|i| start + i).collect(),
            seq: vec![0; tokens.len()],
        }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// How a backend runs one forward pass of a decode micro-batch (`Backend::step_record`): kernel
/// by kernel, or recorded once (a CUDA graph) and replayed for later steps of the same shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepRecord {
    /// Run the operations as they come (and remember the shape: the next such step records).
    Eager,
    /// Record the operations (`record_begin` .. `record_end`), then run the recording.
    Record,
    /// Replay the recording of this shape (`record_replay`) instead of running the operations.
    Replay,
}

/// How a layer attends: its kind and, for sliding layers, the window.
#[derive(Clone, Copy, Debug)]
pub struct AttnSpec {
    pub layer: usize,
    pub kind: LayerKind,
    pub n_swa: usize,
    pub scale: f32,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

/// How a layer prepares its queries and keys before attending: per-head RMSNorm with `eps`
/// (queries also scaled by `q_scale`), then NORM RoPE at `rope_base` on sliding layers.
#[derive(Clone, Copy, Debug)]
pub struct QkSpec {
    pub eps: f32,
    pub q_scale: f32,
    pub rope_base: Option<f32>,
}

/// The operations of a Muse Glimmer forward pass.
pub trait Backend: Send + Sync {
    /// A weight matrix resident where the backend computes.
    type Matrix: Send + Sync;
    /// An f32 vector (norm weights).
    type Vector: Send + Sync;
    /// An f32 activation matrix of `rows` tokens x `cols` values.
    type Act: Send;
    /// The KV cache of one sequence.
    type Kv: Send;

    fn name(&self) -> String;

    /// How many sequences one micro-batch may mix (distinct `Batch::seq` values): a scheduler
    /// batching several sequences splits its step into `forward` calls of at most this many.
    fn max_sequences_per_batch(&self) -> usize {
        1
    }

    /// Most tokens one micro-batch may hold (a device backend sizes its caches' rings and its
    /// scratch for it).
    fn max_batch_tokens(&self) -> usize {
        usize::MAX
    }

    fn matrix(&self, file: &Arc<Gguf>, m: &Matrix) -> Result<Self::Matrix>;
    /// A weight matrix from bytes in ggml's layout (`m` gives its name, format and shape): the
    /// shards of a tensor under tensor parallelism.
    fn matrix_from_bytes(&self, m: &Matrix, bytes: &[u8]) -> Result<Self::Matrix>;
    fn vector(&self, v: &[f32]) -> Result<Self::Vector>;
    /// An activation matrix with room for `rows` rows of `cols` values (initially `rows` rows).
    fn act(&self, rows: usize, cols: usize) -> Result<Self::Act>;
    /// Use the first `rows` rows of an activation matrix (at most the rows it was made with).
    fn set_rows(&self, a: &mut Self::Act, rows: usize) -> Result<()>;
    fn kv_cache(&self, cfg: &MuseConfig, ty: KvType, n_ctx: usize) -> Result<Self::Kv>;
    /// The most positions a sequence's cache holds (its context size).
    fn kv_capacity(&self, kv: &Self::Kv) -> usize;
    /// Positions stored in a sequence's cache (the next token's position).
    fn kv_len(&self, kv: &Self::Kv) -> usize;
    /// Record that positions `..len` are stored, once every layer has written them; or, with
    /// `len` below the stored length and `kv_can_truncate` true, go back to the first `len`
    /// positions (a prompt that shares them continues from there: prefix reuse).
    fn kv_set_len(&self, kv: &mut Self::Kv, len: usize);
    /// Whether the cache may go back to its first `len` positions and continue from there with
    /// other tokens: `len` at most the stored length, and every sliding layer's ring still
    /// holding the positions a token at `len` attends to (`kv::ring_allows_truncate`). A backend
    /// that cannot tell says so only for its stored length.
    fn kv_can_truncate(&self, kv: &Self::Kv, len: usize) -> bool {
        len == self.kv_len(kv)
    }
    /// Forget a sequence's cache.
    fn kv_clear(&self, kv: &mut Self::Kv);
    /// Whether `kv_copy` can copy this backend's caches.
    fn kv_can_copy(&self) -> bool {
        false
    }
    /// Make `dst` a copy of `src`, two caches of this model and context size: every position
    /// `src` holds and its length (a sequence whose prompt another's cache holds starts from
    /// there: the choices of one request). Ordered after the work queued on `src` before it.
    fn kv_copy(&self, src: &Self::Kv, dst: &mut Self::Kv) -> Result<()> {
        let _ = (src, dst);
        Err(Error::Backend(
            "this backend does not copy KV caches".into(),
        ))
    }
    /// The rows a sequence's cache holds that its next token reads, on the host
    /// (`state::KvImage`: saved sequence state). Ordered after the work queued before it.
    fn kv_export(&self, kv: &Self::Kv) -> Result<crate::state::KvImage> {
        let _ = kv;
        Err(Error::Backend(format!(
            "the {} backend does not save KV caches",
            self.name()
        )))
    }
    /// Make `kv` hold exactly `image`'s positions, checked first (`KvImage::check`): a refused
    /// image leaves `kv` as it was; a copy that fails leaves it empty, never holding part of the
    /// image.
    fn kv_import(&self, image: &crate::state::KvImage, kv: &mut Self::Kv) -> Result<()> {
        let _ = (image, kv);
        Err(Error::Backend(format!(
            "the {} backend does not load KV caches",
            self.name()
        )))
    }
    /// Overwrite the first `values.len() / cols` rows of an activation matrix with host values.
    fn write(&self, a: &mut Self::Act, values: &[f32]) -> Result<()>;
    /// Copy an activation matrix to the host.
    fn read(&self, a: &Self::Act) -> Result<Vec<f32>>;
    /// Copy an activation matrix into `out` (resized to fit), reusing its memory: a step's
    /// logits are tens of megabytes at 64 sequences, and a fresh allocation of that size is
    /// new pages every time.
    fn read_into(&self, a: &Self::Act, out: &mut Vec<f32>) -> Result<()> {
        *out = self.read(a)?;
        Ok(())
    }

    /// Rows `rows` of a `cols`-wide activation matrix on the host, concatenated into `out`
    /// (resized to fit, its memory reused). Default: the first rows in order straight into
    /// `out` (`read_into`), any others picked from the whole matrix read.
    fn read_rows_into(
        &self,
        a: &Self::Act,
        cols: usize,
        rows: &[usize],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if rows.is_empty() {
            out.clear();
            return Ok(());
        }
        if rows.iter().enumerate().all(|(i, &r)| i == r) {
            self.read_into(a, out)?;
            if out.len() >= rows.len() * cols {
                out.truncate(rows.len() * cols);
                return Ok(());
            }
            return Err(Error::Backend(format!(
                "row {} is outside the activation matrix",
                out.len() / cols.max(1)
            )));
        }
        let all = self.read(a)?;
        out.clear();
        for &r in rows {
            let row = all.get(r * cols..(r + 1) * cols).ok_or_else(|| {
                Error::Backend(format!("row {r} is outside the activation matrix"))
            })?;
            out.extend_from_slice(row);
        }
        Ok(())
    }

    /// Token `targets[i]`'s log-probability under row `rows[i]` of the `cols`-wide `logits`, and
    /// the row's `tops[i]` most likely tokens with theirs (at most `MAX_TOP_LOGPROBS`), into
    /// `out` (`RowLogprob::of`, the reference). The default reads the rows to the host, a few at
    /// a time; a device computes them where the logits are and sends back what they hold.
    fn row_logprobs(
        &self,
        logits: &Self::Act,
        cols: usize,
        rows: &[usize],
        targets: &[u32],
        tops: &[usize],
        out: &mut Vec<crate::sampling::RowLogprob>,
    ) -> Result<()> {
        check_logprob_rows(rows, targets, tops)?;
        out.clear();
        let mut host = Vec::new();
        for ((r, t), n) in rows.chunks(32).zip(targets.chunks(32)).zip(tops.chunks(32)) {
            use rayon::prelude::*;
            self.read_rows_into(logits, cols, r, &mut host)?;
            out.par_extend(
                host.par_chunks_exact(cols.max(1))
                    .zip(t.par_iter().zip(n))
                    .map(|(row, (&t, &n))| crate::sampling::RowLogprob::of(row, t, n)),
            );
        }
        Ok(())
    }

    /// Whether `draw_rows` runs where the logits are (a device): a caller then leaves on the
    /// backend the rows whose token is all it needs.
    fn draws_on_device(&self) -> bool {
        false
    }
    /// One token per listed row of the `cols`-wide `logits` (row `rows[i]` chosen by
    /// `draws[i]`, `RowDraw`; each row at most once), into `out`, or `sampling::NOT_FINITE` for
    /// a row holding a NaN or an infinity before its edits. The logits are left as they are
    /// (a row may be drawn again, say under a grammar's mask, `RowDraw::allowed`, and a row may
    /// be listed more than once); the default reads the rows to the host, edits the copy and
    /// chooses through `RowDraw::choose` (the reference of a device implementation).
    fn draw_rows(
        &self,
        logits: &mut Self::Act,
        cols: usize,
        rows: &[usize],
        draws: &[RowDraw],
        out: &mut Vec<u32>,
    ) -> Result<()> {
        if rows.len() != draws.len() {
            return Err(Error::Backend(format!(
                "{} rows and {} draws",
                rows.len(),
                draws.len()
            )));
        }
        let mut host = Vec::new();
        self.read_rows_into(logits, cols, rows, &mut host)?;
        out.clear();
        for (row, d) in host.chunks_exact_mut(cols.max(1)).zip(draws) {
            if row.iter().any(|v| !v.is_finite()) {
                out.push(crate::sampling::NOT_FINITE);
                continue;
            }
            d.edit(row);
            out.push(d.choose(row));
        }
        Ok(())
    }

    /// How to run the forward pass of `batch` (validated: positions continue the caches, token
    /// ids in the vocabulary) with every row's logits wanted, into the workspace `ws_id`
    /// (`Workspace::id`: a recording uses that workspace's buffers). Default: eager, always.
    fn step_record(
        &self,
        _batch: &Batch,
        _caches: &mut [&mut Self::Kv],
        _ws_id: u64,
    ) -> Result<StepRecord> {
        Ok(StepRecord::Eager)
    }
    /// After an eager step that `step_record` was asked about: whether it ran to the end.
    fn step_ran(&self, _ok: bool) {}
    /// Run `ops`, a forward pass's operations issued one after another. A backend whose
    /// operations run on its own threads runs `ops` on one of them, so that an operation's work
    /// is not handed to those threads and waited for from outside each time. Default: `ops()`.
    fn run_ops(&self, ops: &mut (dyn FnMut() -> Result<()> + Send)) -> Result<()> {
        ops()
    }
    /// Start recording the step of `batch` (after `step_record` answered `Record`): its token
    /// ids, positions and caches are made available first (the recording does not do it).
    fn record_begin(&self, _batch: &Batch, _caches: &mut [&mut Self::Kv]) -> Result<()> {
        Ok(())
    }
    /// End the recording begun by `record_begin` (`ok`: whether the recorded operations all
    /// succeeded). Returns whether the recording was kept and has run; if not, the caller runs
    /// the step again without recording. Default: `record_close`, then `record_run` if kept.
    fn record_end(&self, ok: bool) -> Result<bool> {
        if !self.record_close(ok)? {
            return Ok(false);
        }
        self.record_run()?;
        Ok(true)
    }
    /// The first half of `record_end`: end the recording and keep it, without running it
    /// (several backends that record one step together, the ranks of a tensor-parallel step
    /// whose recordings meet in collectives, run theirs only when every one was kept).
    fn record_close(&self, _ok: bool) -> Result<bool> {
        Ok(false)
    }
    /// The second half of `record_end`: run the recording `record_close` just kept.
    fn record_run(&self) -> Result<()> {
        Err(Error::Backend("this backend records no steps".into()))
    }
    /// Replay the recording for `batch`'s shape (after `step_record` answered `Replay`): the
    /// batch's token ids, positions and caches are made available, then the recording runs.
    fn record_replay(&self, _batch: &Batch, _caches: &mut [&mut Self::Kv]) -> Result<()> {
        Err(Error::Backend("this backend records no steps".into()))
    }
    /// Make the batch's token ids and positions available to the operations that follow
    /// (a device backend uploads them here).
    fn begin_batch(&self, _batch: &Batch) -> Result<()> {
        Ok(())
    }
    /// out[i] = row `tokens[i]` of `table`, dequantized.
    fn get_rows(&self, table: &Self::Matrix, tokens: &[u32], out: &mut Self::Act) -> Result<()>;
    /// out[i] = x[i] * (1 / sqrt(mean(x[i]^2) + eps)) (* w when given).
    fn rms_norm(
        &self,
        x: &Self::Act,
        w: Option<&Self::Vector>,
        eps: f32,
        out: &mut Self::Act,
    ) -> Result<()>;
    /// out[i] = W x[i] for every row of x.
    fn matmul(&self, w: &Self::Matrix, x: &Self::Act, out: &mut Self::Act) -> Result<()>;
    /// out1 = W1 x and out2 = W2 x for every row of x: two products of the same input (the
    /// attention's Q and gate, K and V), which a device backend may compute in one launch.
    fn matmul_pair(
        &self,
        w1: &Self::Matrix,
        w2: &Self::Matrix,
        x: &Self::Act,
        out1: &mut Self::Act,
        out2: &mut Self::Act,
    ) -> Result<()> {
        self.matmul(w1, x, out1)?;
        self.matmul(w2, x, out2)
    }
    /// outs[i] = ws[i] x for every row of x: products of the same input (the attention's Q,
    /// gate, K and V). Reference composition: `matmul_pair` on consecutive pairs (then `matmul`
    /// on a last one left over). A backend may compute them as one product of the matrices
    /// stacked only where each output keeps its own product's arithmetic, or in a mode held to a
    /// tolerance (CUDA `--mode fast --fp8-weights`, whose stacked product may sum in another
    /// order; which form runs also depends on the memory left for its copy).
    fn matmul_group(
        &self,
        ws: &[&Self::Matrix],
        x: &Self::Act,
        outs: &mut [&mut Self::Act],
    ) -> Result<()> {
        matmul_by_pairs(self, ws, x, outs)
    }
    /// Per-head RMSNorm of each `head_dim` slice of every row, times the constant `scale`.
    fn head_norm(&self, x: &mut Self::Act, head_dim: usize, eps: f32, scale: f32) -> Result<()>;
    /// NORM-convention RoPE (pairs `(x[2j], x[2j+1])`) of every head of every row, at the row's
    /// position in `batch`, with `theta_j = pos * base^(-2j/head_dim)`.
    fn rope(&self, x: &mut Self::Act, head_dim: usize, batch: &Batch, freq_base: f32)
    -> Result<()>;
    /// Store this batch's K and V rows in the caches and attend: `out` = softmax(q k^T * scale
    /// + mask) v, with the causal mask, restricted to `0 <= i - j < n_swa` on sliding layers.
    fn attention(
        &self,
        caches: &mut [&mut Self::Kv],
        spec: AttnSpec,
        batch: &Batch,
        q: &Self::Act,
        k: &Self::Act,
        v: &Self::Act,
        out: &mut Self::Act,
    ) -> Result<()>;
    /// Attention followed by the output gate, `out = attention(...) * sigmoid(gate)`.
    /// Reference composition; a backend may fuse the gate into its attention epilogue.
    #[allow(clippy::too_many_arguments)]
    fn attention_gated(
        &self,
        caches: &mut [&mut Self::Kv],
        spec: AttnSpec,
        batch: &Batch,
        q: &Self::Act,
        k: &Self::Act,
        v: &Self::Act,
        gate: Option<&Self::Act>,
        out: &mut Self::Act,
    ) -> Result<()> {
        self.attention(caches, spec, batch, q, k, v, out)?;
        match gate {
            Some(g) => self.sigmoid_gate(out, g),
            None => Ok(()),
        }
    }
    /// A layer's attention from its raw projections: QK-norm, RoPE (sliding layers), the KV
    /// store, attention and the output gate. Reference composition; a backend may fuse it.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        caches: &mut [&mut Self::Kv],
        spec: AttnSpec,
        qk: QkSpec,
        batch: &Batch,
        q: &mut Self::Act,
        k: &mut Self::Act,
        v: &Self::Act,
        gate: &Self::Act,
        out: &mut Self::Act,
    ) -> Result<()> {
        self.head_norm(q, spec.head_dim, qk.eps, qk.q_scale)?;
        self.head_norm(k, spec.head_dim, qk.eps, 1.0)?;
        if let Some(base) = qk.rope_base {
            self.rope(q, spec.head_dim, batch, base)?;
            self.rope(k, spec.head_dim, batch, base)?;
        }
        self.attention_gated(caches, spec, batch, q, k, v, Some(gate), out)
    }
    /// x *= sigmoid(g), elementwise (the attention output gate).
    fn sigmoid_gate(&self, x: &mut Self::Act, g: &Self::Act) -> Result<()>;
    /// out = silu(gate) * up, elementwise.
    fn swiglu(&self, gate: &Self::Act, up: &Self::Act, out: &mut Self::Act) -> Result<()>;
    /// resid += rms_norm(src, eps) * w (a post norm and its residual add).
    fn post_norm_add(
        &self,
        resid: &mut Self::Act,
        src: &Self::Act,
        w: &Self::Vector,
        eps: f32,
    ) -> Result<()>;
    /// x = softcap * tanh(x * scale / softcap), or x * scale without a cap.
    fn logit_finish(&self, x: &mut Self::Act, scale: f32, softcap: Option<f32>) -> Result<()>;
    /// out = rows `rows` of x.
    fn select_rows(&self, x: &Self::Act, rows: &[usize], out: &mut Self::Act) -> Result<()>;

    /// The fused sandwich tail: `resid += rms_norm(src, eps_post) * w_post`, then
    /// `next = rms_norm(resid, eps_next) * w_next`. Reference composition; backends may fuse
    /// only if they keep this arithmetic (two reductions, two epsilons).
    #[allow(clippy::too_many_arguments)]
    fn norm_tail(
        &self,
        resid: &mut Self::Act,
        src: &Self::Act,
        w_post: &Self::Vector,
        eps_post: f32,
        w_next: &Self::Vector,
        eps_next: f32,
        next: &mut Self::Act,
    ) -> Result<()> {
        self.post_norm_add(resid, src, w_post, eps_post)?;
        self.rms_norm(resid, Some(w_next), eps_next, next)
    }

    /// The feed-forward's first half: `out = silu(W_gate x) * (W_up x)`. Reference composition
    /// (`gate` and `up` are scratch for it); a backend may fuse it only if each row's two products
    /// and the SwiGLU keep this arithmetic, except in a mode held to a tolerance instead of the
    /// anchors' arithmetic (CUDA `--mode fast`: there the FP8 form stacks gate and up in one
    /// product, whose sums may run in another order; docs/PARITY.md).
    #[allow(clippy::too_many_arguments)]
    fn ffn_swiglu(
        &self,
        w_gate: &Self::Matrix,
        w_up: &Self::Matrix,
        x: &Self::Act,
        gate: &mut Self::Act,
        up: &mut Self::Act,
        out: &mut Self::Act,
    ) -> Result<()> {
        self.matmul(w_gate, x, gate)?;
        self.matmul(w_up, x, up)?;
        self.swiglu(gate, up, out)
    }
}

/// `Backend::matmul_group`'s reference composition: `matmul_pair` on consecutive pairs of `ws`,
/// `matmul` on a last one left over (for backends that take the group apart).
pub fn matmul_by_pairs<B: Backend + ?Sized>(
    b: &B,
    ws: &[&B::Matrix],
    x: &B::Act,
    outs: &mut [&mut B::Act],
) -> Result<()> {
    if ws.len() != outs.len() {
        return Err(Error::Backend(format!(
            "matmul_group: {} matrices, {} outputs",
            ws.len(),
            outs.len()
        )));
    }
    for (w, o) in ws.chunks(2).zip(outs.chunks_mut(2)) {
        if let ([w1, w2], [o1, o2]) = (w, &mut *o) {
            b.matmul_pair(w1, w2, x, o1, o2)?;
        } else {
            for (w1, o1) in w.iter().zip(o.iter_mut()) {
                b.matmul(w1, x, o1)?;
            }
        }
    }
    Ok(())
}

/// `row_logprobs`'s arguments agree: a target and a count of alternatives for every row, none
/// past `MAX_TOP_LOGPROBS`.
pub fn check_logprob_rows(rows: &[usize], targets: &[u32], tops: &[usize]) -> Result<()> {
    use crate::sampling::MAX_TOP_LOGPROBS;
    if rows.len() != targets.len() || rows.len() != tops.len() {
        return Err(Error::Backend(format!(
            "{} rows, {} targets and {} counts of alternatives",
            rows.len(),
            targets.len(),
            tops.len()
        )));
    }
    if let Some(&n) = tops.iter().find(|&&n| n > MAX_TOP_LOGPROBS) {
        return Err(Error::Backend(format!(
            "{n} alternatives asked of a row's log-probabilities: at most {MAX_TOP_LOGPROBS}"
        )));
    }
    Ok(())
}
