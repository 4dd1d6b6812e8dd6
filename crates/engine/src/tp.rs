//! Tensor parallelism as a backend: [`TpBackend`] spreads every layer over `world` ranks, each a
//! backend of its own (a GPU, or a CPU backend when the ranks are simulated), so the model file
//! stays written once.
//!
//! The split is Megatron's, as vLLM and llama.cpp's tensor-split mode do it:
//! - Q, gate (by query heads), K, V (by KV heads), FFN gate and up (by FFN columns) and the LM
//!   head (by vocabulary rows) are split by output rows: each rank computes its slice.
//! - O and FFN down are split by input columns: each rank computes a partial sum of the full
//!   output, and one all-reduce (a sum in rank order, so the result does not depend on timing)
//!   follows each of the two.
//! - Norms, QK-norm, RoPE and the gate run on each rank's slice or on the replicated stream.
//! - KV heads: with `world <= n_head_kv` each rank holds `n_head_kv / world` of them; with more
//!   ranks than KV heads (Muse Glimmer has 2), each KV head is replicated on the ranks whose
//!   query heads read it (`world` must then be a multiple of `n_head_kv`): K and V of that head
//!   are computed and cached on each of those ranks, which costs 2 x 256 rows of projection per
//!   rank and keeps attention free of communication.
//! - Quantized tensors split only at block boundaries; a plan that would cut a block is refused.
//!
//! The all-reduce is an [`AllReduce`]: through the host by default ([`HostAllReduce`], the CPU
//! simulation), or a device collective a backend crate supplies (NCCL in `muser-cuda`).

use std::ops::Range;
use std::sync::Arc;

use muser_gguf::Gguf;

use crate::backend::{AttnSpec, Backend, Batch, StepRecord};
use crate::config::MuseConfig;
use crate::error::{Error, Result};
use crate::kv::KvType;
use crate::loader::{Matrix, Tensors};

/// Which rows / columns each rank owns.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardPlan {
    pub world: usize,
    pub head_dim: usize,
    /// Query heads of each rank.
    pub heads: Vec<Range<usize>>,
    /// KV heads of each rank (overlapping when replicated).
    pub kv_heads: Vec<Range<usize>>,
    /// FFN columns of each rank.
    pub ff: Vec<Range<usize>>,
    /// LM-head (vocabulary) rows of each rank.
    pub vocab: Vec<Range<usize>>,
}

/// `n` units split into `world` contiguous ranges as evenly as possible (the first ranks get one
/// more), each scaled by `unit`.
fn even(n: usize, world: usize, unit: usize) -> Vec<Range<usize>> {
    let (q, r) = (n / world, n % world);
    let mut start = 0;
    (0..world)
        .map(|i| {
            let len = q + usize::from(i < r);
            let range = start * unit..(start + len) * unit;
            start += len;
            range
        })
        .collect()
}

impl ShardPlan {
    /// Plan a split of `c` over `world` ranks for the tensors `t` (their formats decide the
    /// block granularity of the column splits).
    pub fn new(c: &MuseConfig, t: &Tensors, world: usize) -> Result<Self> {
        if world == 0 {
            return Err(Error::Config(
                "tensor parallelism needs at least one rank".into(),
            ));
        }
        if c.n_head % world != 0 {
            return Err(Error::Config(format!(
                "{} query heads cannot be split over {world} ranks",
                c.n_head
            )));
        }
        let heads = even(c.n_head, world, 1);
        let rep = c.n_head / c.n_head_kv;
        let kv_heads: Vec<Range<usize>> = if world <= c.n_head_kv {
            if c.n_head_kv % world != 0 {
                return Err(Error::Config(format!(
                    "{} KV heads cannot be split over {world} ranks",
                    c.n_head_kv
                )));
            }
            even(c.n_head_kv, world, 1)
        } else {
            if world % c.n_head_kv != 0 {
                return Err(Error::Config(format!(
                    "{world} ranks are not a multiple of the {} KV heads, so KV heads cannot be replicated evenly",
                    c.n_head_kv
                )));
            }
            heads
                .iter()
                .map(|h| h.start / rep..h.start / rep + 1)
                .collect()
        };
        for (h, g) in heads.iter().zip(&kv_heads) {
            if h.start / rep != g.start || (h.end - 1) / rep != g.end - 1 {
                return Err(Error::Config(
                    "query heads and their KV heads would land on different ranks".into(),
                ));
            }
        }
        // Column splits must keep whole quantization blocks of O and FFN down.
        let o_block = t
            .layers
            .iter()
            .map(|l| l.attn_output.ty.block_size())
            .max()
            .unwrap_or(1);
        let down_block = t
            .layers
            .iter()
            .map(|l| l.ffn_down.ty.block_size())
            .max()
            .unwrap_or(1);
        for h in &heads {
            let cols = h.len() * c.head_dim;
            if cols % o_block != 0 {
                return Err(Error::Config(format!(
                    "each rank would hold {cols} columns of attn_output, not whole blocks of {o_block}: use fewer ranks"
                )));
            }
        }
        if c.n_ff % down_block != 0 {
            return Err(Error::Config(format!(
                "n_ff {} is not whole blocks of {down_block}",
                c.n_ff
            )));
        }
        if c.n_ff / down_block < world {
            return Err(Error::Config(format!(
                "{} FFN blocks cannot be split over {world} ranks",
                c.n_ff / down_block
            )));
        }
        Ok(ShardPlan {
            world,
            head_dim: c.head_dim,
            heads,
            kv_heads,
            ff: even(c.n_ff / down_block, world, down_block),
            vocab: even(c.n_vocab, world, 1),
        })
    }

    /// The configuration rank `r` computes with (its heads).
    fn rank_config(&self, c: &MuseConfig, r: usize) -> MuseConfig {
        let mut rc = c.clone();
        rc.n_head = self.heads[r].len();
        rc.n_head_kv = self.kv_heads[r].len();
        rc
    }

    fn scaled(ranges: &[Range<usize>], unit: usize) -> Vec<Range<usize>> {
        ranges
            .iter()
            .map(|r| r.start * unit..r.end * unit)
            .collect()
    }

    /// How the tensor called `name` is split.
    fn shard_of(&self, name: &str) -> Shard {
        let hd = self.head_dim;
        let suffix = name
            .rsplit_once("blk.")
            .map_or(name, |(_, s)| s.split_once('.').map_or(s, |(_, x)| x));
        match suffix {
            "attn_q.weight" | "attn_gate.weight" => Shard::Rows(Self::scaled(&self.heads, hd)),
            "attn_k.weight" | "attn_v.weight" => Shard::Rows(Self::scaled(&self.kv_heads, hd)),
            "attn_output.weight" => Shard::Cols(Self::scaled(&self.heads, hd)),
            "ffn_gate.weight" | "ffn_up.weight" => Shard::Rows(self.ff.clone()),
            "ffn_down.weight" => Shard::Cols(self.ff.clone()),
            "output.weight" => Shard::Rows(self.vocab.clone()),
            _ => Shard::Replicated,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Shard {
    Replicated,
    /// Output rows per rank.
    Rows(Vec<Range<usize>>),
    /// Input columns per rank (partial sums, then an all-reduce).
    Cols(Vec<Range<usize>>),
}

/// A matrix split over the ranks.
pub struct TpMatrix<M> {
    shard: Shard,
    rows: usize,
    parts: Vec<M>,
}

/// Activations: replicated on every rank, or split by columns.
pub struct TpAct<A> {
    rows: usize,
    cols: usize,
    cap: usize,
    /// `None`: every part holds all `cols` columns; `Some(ranges)`: part r holds columns ranges[r].
    split: Option<Vec<Range<usize>>>,
    parts: Vec<A>,
}

/// One sequence's cache: each rank caches the KV heads it owns.
pub struct TpKv<K> {
    parts: Vec<K>,
}

/// How the ranks' full-width partial sums become one sum on every rank.
pub trait AllReduce<B: Backend>: Send + Sync {
    /// Replace every part (`rows` x `cols` each) by the sum of all parts.
    fn all_reduce(&self, ranks: &[B], parts: &mut [B::Act]) -> Result<()>;
    /// For logs and `bench`: "host", "nccl".
    fn name(&self) -> &'static str;
}

/// Sums through the host, in rank order (so the result does not depend on timing): every rank's
/// part is read, added, and written back. Any backend; a synchronisation per all-reduce.
pub struct HostAllReduce;

impl<B: Backend> AllReduce<B> for HostAllReduce {
    fn all_reduce(&self, ranks: &[B], parts: &mut [B::Act]) -> Result<()> {
        let mut sum = ranks[0].read(&parts[0])?;
        for (b, p) in ranks.iter().zip(parts.iter()).skip(1) {
            for (s, v) in sum.iter_mut().zip(b.read(p)?) {
                *s += v;
            }
        }
        for (b, p) in ranks.iter().zip(parts.iter_mut()) {
            b.write(p, &sum)?;
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "host"
    }
}

/// A backend of `world` ranks.
pub struct TpBackend<B: Backend> {
    pub ranks: Vec<B>,
    pub plan: ShardPlan,
    reduce: Box<dyn AllReduce<B>>,
    /// Between `record_begin` and `record_end`: the ranks are recording a step, and no part may
    /// be reallocated (the recordings would hold the old buffers).
    recording: std::sync::atomic::AtomicBool,
}

impl<B: Backend> TpBackend<B> {
    pub fn new(ranks: Vec<B>, plan: ShardPlan) -> Result<Self> {
        if ranks.len() != plan.world {
            return Err(Error::Config(format!(
                "{} ranks for a plan of {}",
                ranks.len(),
                plan.world
            )));
        }
        Ok(TpBackend {
            ranks,
            plan,
            reduce: Box::new(HostAllReduce),
            recording: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Use `reduce` for the two all-reduces of every layer (a device collective).
    pub fn with_all_reduce(mut self, reduce: Box<dyn AllReduce<B>>) -> Self {
        self.reduce = reduce;
        self
    }

    /// Make `a` split by `ranges` (or replicated), reallocating parts whose width changes.
    fn shape(&self, a: &mut TpAct<B::Act>, split: Option<Vec<Range<usize>>>) -> Result<()> {
        if a.split == split {
            return Ok(());
        }
        if self.recording.load(std::sync::atomic::Ordering::SeqCst) {
            // The step then runs unrecorded (record_end with ok = false), where this is fine.
            return Err(Error::Backend(
                "tensor parallelism: an activation changes its split in a recorded step".into(),
            ));
        }
        for (r, b) in self.ranks.iter().enumerate() {
            let w = split.as_ref().map_or(a.cols, |s| s[r].len());
            let mut part = b.act(a.cap, w)?;
            b.set_rows(&mut part, a.rows)?;
            a.parts[r] = part;
        }
        a.split = split;
        Ok(())
    }

    fn need_replicated(a: &TpAct<B::Act>, what: &str) -> Result<()> {
        match a.split {
            None => Ok(()),
            Some(_) => Err(Error::Backend(format!(
                "tensor parallelism: {what} needs a replicated input"
            ))),
        }
    }

    /// Sum the ranks' full-width partial results into every part of `out`.
    fn all_reduce(&self, out: &mut TpAct<B::Act>) -> Result<()> {
        self.reduce.all_reduce(&self.ranks, &mut out.parts)
    }

    /// `f(backend, that rank's parts of the caches)` for every rank, in rank order.
    fn each_kv<T>(
        &self,
        caches: &mut [&mut TpKv<B::Kv>],
        mut f: impl FnMut(&B, &mut [&mut B::Kv]) -> Result<T>,
    ) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(self.ranks.len());
        for (r, b) in self.ranks.iter().enumerate() {
            let mut parts: Vec<&mut B::Kv> = caches.iter_mut().map(|c| &mut c.parts[r]).collect();
            out.push(f(b, &mut parts)?);
        }
        Ok(out)
    }

    fn each<T>(&self, mut f: impl FnMut(usize, &B) -> Result<T>) -> Result<Vec<T>> {
        self.ranks
            .iter()
            .enumerate()
            .map(|(r, b)| f(r, b))
            .collect()
    }
}

fn slice_rows(m: &Matrix, bytes: &[u8], rows: &Range<usize>) -> Result<(Matrix, Vec<u8>)> {
    let rb = m.row_bytes();
    let sub = Matrix::detached(&m.name, m.ty, rows.len(), m.cols)?;
    Ok((sub, bytes[rows.start * rb..rows.end * rb].to_vec()))
}

fn slice_cols(m: &Matrix, bytes: &[u8], cols: &Range<usize>) -> Result<(Matrix, Vec<u8>)> {
    let (bl, bs) = m.ty.block_geometry();
    if cols.start % bl != 0 || cols.end % bl != 0 {
        return Err(Error::Config(format!(
            "{}: columns {cols:?} cut {} blocks",
            m.name, m.ty
        )));
    }
    let rb = m.row_bytes();
    let (a, b) = (cols.start / bl * bs, cols.end / bl * bs);
    let mut out = Vec::with_capacity(m.rows * (b - a));
    for row in bytes.chunks_exact(rb) {
        out.extend_from_slice(&row[a..b]);
    }
    Ok((Matrix::detached(&m.name, m.ty, m.rows, cols.len())?, out))
}

impl<B: Backend> Backend for TpBackend<B> {
    type Matrix = TpMatrix<B::Matrix>;
    type Vector = Vec<B::Vector>;
    type Act = TpAct<B::Act>;
    type Kv = TpKv<B::Kv>;

    fn name(&self) -> String {
        format!(
            "tensor-parallel x{} over {} ({} all-reduce)",
            self.plan.world,
            self.ranks[0].name(),
            self.reduce.name()
        )
    }

    fn max_sequences_per_batch(&self) -> usize {
        self.ranks
            .iter()
            .map(|b| b.max_sequences_per_batch())
            .min()
            .unwrap_or(1)
    }

    fn max_batch_tokens(&self) -> usize {
        self.ranks
            .iter()
            .map(|b| b.max_batch_tokens())
            .min()
            .unwrap_or(usize::MAX)
    }

    fn matrix(&self, file: &Arc<Gguf>, m: &Matrix) -> Result<TpMatrix<B::Matrix>> {
        self.matrix_from_bytes(m, m.bytes(file))
    }

    fn matrix_from_bytes(&self, m: &Matrix, bytes: &[u8]) -> Result<TpMatrix<B::Matrix>> {
        let shard = self.plan.shard_of(&m.name);
        let parts = self.each(|r, b| match &shard {
            Shard::Replicated => b.matrix_from_bytes(m, bytes),
            Shard::Rows(rr) => {
                let (sub, data) = slice_rows(m, bytes, &rr[r])?;
                b.matrix_from_bytes(&sub, &data)
            }
            Shard::Cols(cc) => {
                let (sub, data) = slice_cols(m, bytes, &cc[r])?;
                b.matrix_from_bytes(&sub, &data)
            }
        })?;
        Ok(TpMatrix {
            shard,
            rows: m.rows,
            parts,
        })
    }

    fn vector(&self, v: &[f32]) -> Result<Vec<B::Vector>> {
        self.each(|_, b| b.vector(v))
    }

    fn act(&self, rows: usize, cols: usize) -> Result<TpAct<B::Act>> {
        Ok(TpAct {
            rows,
            cols,
            cap: rows,
            split: None,
            parts: self.each(|_, b| b.act(rows, cols))?,
        })
    }

    fn set_rows(&self, a: &mut TpAct<B::Act>, rows: usize) -> Result<()> {
        for (b, p) in self.ranks.iter().zip(a.parts.iter_mut()) {
            b.set_rows(p, rows)?;
        }
        a.rows = rows;
        Ok(())
    }

    fn kv_cache(&self, cfg: &MuseConfig, ty: KvType, n_ctx: usize) -> Result<TpKv<B::Kv>> {
        Ok(TpKv {
            parts: self.each(|r, b| b.kv_cache(&self.plan.rank_config(cfg, r), ty, n_ctx))?,
        })
    }

    fn kv_capacity(&self, kv: &TpKv<B::Kv>) -> usize {
        self.ranks[0].kv_capacity(&kv.parts[0])
    }

    fn kv_len(&self, kv: &TpKv<B::Kv>) -> usize {
        self.ranks[0].kv_len(&kv.parts[0])
    }

    fn kv_set_len(&self, kv: &mut TpKv<B::Kv>, len: usize) {
        for (b, p) in self.ranks.iter().zip(kv.parts.iter_mut()) {
            b.kv_set_len(p, len);
        }
    }

    fn kv_clear(&self, kv: &mut TpKv<B::Kv>) {
        for (b, p) in self.ranks.iter().zip(kv.parts.iter_mut()) {
            b.kv_clear(p);
        }
    }

    fn kv_can_copy(&self) -> bool {
        self.ranks.iter().all(|b| b.kv_can_copy())
    }

    fn kv_copy(&self, src: &TpKv<B::Kv>, dst: &mut TpKv<B::Kv>) -> Result<()> {
        for ((b, s), d) in self.ranks.iter().zip(&src.parts).zip(dst.parts.iter_mut()) {
            b.kv_copy(s, d)?;
        }
        Ok(())
    }

    fn kv_can_truncate(&self, kv: &TpKv<B::Kv>, len: usize) -> bool {
        self.ranks
            .iter()
            .zip(&kv.parts)
            .all(|(b, p)| b.kv_can_truncate(p, len))
    }

    fn write(&self, a: &mut TpAct<B::Act>, values: &[f32]) -> Result<()> {
        self.shape(a, None)?;
        for (b, p) in self.ranks.iter().zip(a.parts.iter_mut()) {
            b.write(p, values)?;
        }
        Ok(())
    }

    /// Replicated: rank 0's copy; split: the columns gathered in rank order.
    fn read(&self, a: &TpAct<B::Act>) -> Result<Vec<f32>> {
        let Some(split) = &a.split else {
            return self.ranks[0].read(&a.parts[0]);
        };
        let mut out = vec![0f32; a.rows * a.cols];
        for ((b, p), range) in self.ranks.iter().zip(&a.parts).zip(split) {
            let part = b.read(p)?;
            let w = range.len();
            for (row, src) in part.chunks_exact(w.max(1)).take(a.rows).enumerate() {
                out[row * a.cols + range.start..row * a.cols + range.end].copy_from_slice(src);
            }
        }
        Ok(out)
    }

    fn begin_batch(&self, batch: &Batch) -> Result<()> {
        self.each(|_, b| b.begin_batch(batch)).map(|_| ())
    }

    // Recorded steps (CUDA graphs on GPU ranks): every rank records its part of the step, the
    // collectives included, and replays it; one host thread launches them all. The ranks must
    // agree: a rank recording or replaying alone would wait in a collective for the others.

    fn step_record(
        &self,
        batch: &Batch,
        caches: &mut [&mut TpKv<B::Kv>],
        ws_id: u64,
    ) -> Result<StepRecord> {
        let modes = self.each_kv(caches, |b, parts| b.step_record(batch, parts, ws_id))?;
        if modes.iter().all(|&m| m == modes[0]) {
            return Ok(modes[0]);
        }
        // Disagreeing ranks (one kept a recording another lost): eager, and no rank takes this
        // step as its warm-up for a recording.
        for b in &self.ranks {
            b.step_ran(false);
        }
        Ok(StepRecord::Eager)
    }

    fn step_ran(&self, ok: bool) {
        for b in &self.ranks {
            b.step_ran(ok);
        }
    }

    fn record_begin(&self, batch: &Batch, caches: &mut [&mut TpKv<B::Kv>]) -> Result<()> {
        let mut begun = 0;
        let r = self.each_kv(caches, |b, parts| {
            b.record_begin(batch, parts)?;
            begun += 1;
            Ok(())
        });
        if let Err(e) = r {
            // Close the recordings already begun, keeping none.
            for b in &self.ranks[..begun] {
                let _ = b.record_close(false);
            }
            return Err(e);
        }
        self.recording
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    fn record_end(&self, ok: bool) -> Result<bool> {
        self.recording
            .store(false, std::sync::atomic::Ordering::SeqCst);
        // Every rank's recording ends (an error is kept for after the others have ended).
        let closed: Vec<Result<bool>> = self.ranks.iter().map(|b| b.record_close(ok)).collect();
        let mut all = true;
        for c in closed {
            all &= c?;
        }
        if !all {
            return Ok(false);
        }
        for b in &self.ranks {
            b.record_run()?;
        }
        Ok(true)
    }

    fn record_replay(&self, batch: &Batch, caches: &mut [&mut TpKv<B::Kv>]) -> Result<()> {
        self.each_kv(caches, |b, parts| b.record_replay(batch, parts))
            .map(|_| ())
    }

    fn get_rows(
        &self,
        table: &TpMatrix<B::Matrix>,
        tokens: &[u32],
        out: &mut TpAct<B::Act>,
    ) -> Result<()> {
        if table.shard != Shard::Replicated {
            return Err(Error::Backend(
                "tensor parallelism: the embedding table must be replicated".into(),
            ));
        }
        self.shape(out, None)?;
        for ((b, t), o) in self
            .ranks
            .iter()
            .zip(&table.parts)
            .zip(out.parts.iter_mut())
        {
            b.get_rows(t, tokens, o)?;
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &TpAct<B::Act>,
        w: Option<&Vec<B::Vector>>,
        eps: f32,
        out: &mut TpAct<B::Act>,
    ) -> Result<()> {
        Self::need_replicated(x, "rms_norm")?;
        self.shape(out, None)?;
        for (r, b) in self.ranks.iter().enumerate() {
            b.rms_norm(&x.parts[r], w.map(|w| &w[r]), eps, &mut out.parts[r])?;
        }
        Ok(())
    }

    fn matmul(
        &self,
        w: &TpMatrix<B::Matrix>,
        x: &TpAct<B::Act>,
        out: &mut TpAct<B::Act>,
    ) -> Result<()> {
        match &w.shard {
            Shard::Replicated => {
                Self::need_replicated(x, "a replicated matrix")?;
                self.shape(out, None)?;
                for (r, b) in self.ranks.iter().enumerate() {
                    b.matmul(&w.parts[r], &x.parts[r], &mut out.parts[r])?;
                }
                Ok(())
            }
            Shard::Rows(rows) => {
                Self::need_replicated(x, "a row-split matrix")?;
                self.shape(out, Some(rows.clone()))?;
                for (r, b) in self.ranks.iter().enumerate() {
                    b.matmul(&w.parts[r], &x.parts[r], &mut out.parts[r])?;
                }
                Ok(())
            }
            Shard::Cols(cols) => {
                if x.split.as_ref() != Some(cols) {
                    return Err(Error::Backend(
                        "tensor parallelism: a column-split matrix needs the matching split input"
                            .into(),
                    ));
                }
                self.shape(out, None)?;
                debug_assert_eq!(out.cols, w.rows);
                for (r, b) in self.ranks.iter().enumerate() {
                    b.matmul(&w.parts[r], &x.parts[r], &mut out.parts[r])?;
                }
                self.all_reduce(out)
            }
        }
    }

    fn matmul_group(
        &self,
        ws: &[&TpMatrix<B::Matrix>],
        x: &TpAct<B::Act>,
        outs: &mut [&mut TpAct<B::Act>],
    ) -> Result<()> {
        // Matrices split by rows (or whole) over the replicated input: every rank takes its
        // slices as one group (the rank's backend may stack them); otherwise one by one.
        let by_rows = |w: &&TpMatrix<B::Matrix>| match &w.shard {
            Shard::Rows(rows) => Some(Some(rows.clone())),
            Shard::Replicated => Some(None),
            Shard::Cols(_) => None,
        };
        let splits: Option<Vec<_>> = ws.iter().map(by_rows).collect();
        let (Some(splits), true, None) = (splits, ws.len() == outs.len(), &x.split) else {
            return crate::backend::matmul_by_pairs(self, ws, x, outs);
        };
        for (o, split) in outs.iter_mut().zip(splits) {
            self.shape(o, split)?;
        }
        for (r, b) in self.ranks.iter().enumerate() {
            let parts: Vec<&B::Matrix> = ws.iter().map(|w| &w.parts[r]).collect();
            let mut local: Vec<&mut B::Act> = outs.iter_mut().map(|o| &mut o.parts[r]).collect();
            b.matmul_group(&parts, &x.parts[r], &mut local)?;
        }
        Ok(())
    }

    fn head_norm(
        &self,
        x: &mut TpAct<B::Act>,
        head_dim: usize,
        eps: f32,
        scale: f32,
    ) -> Result<()> {
        for (b, p) in self.ranks.iter().zip(x.parts.iter_mut()) {
            b.head_norm(p, head_dim, eps, scale)?;
        }
        Ok(())
    }

    fn rope(
        &self,
        x: &mut TpAct<B::Act>,
        head_dim: usize,
        batch: &Batch,
        freq_base: f32,
    ) -> Result<()> {
        for (b, p) in self.ranks.iter().zip(x.parts.iter_mut()) {
            b.rope(p, head_dim, batch, freq_base)?;
        }
        Ok(())
    }

    fn attention(
        &self,
        caches: &mut [&mut TpKv<B::Kv>],
        spec: AttnSpec,
        batch: &Batch,
        q: &TpAct<B::Act>,
        k: &TpAct<B::Act>,
        v: &TpAct<B::Act>,
        out: &mut TpAct<B::Act>,
    ) -> Result<()> {
        self.shape(out, q.split.clone())?;
        for (r, b) in self.ranks.iter().enumerate() {
            let rs = AttnSpec {
                n_head: self.plan.heads[r].len(),
                n_head_kv: self.plan.kv_heads[r].len(),
                ..spec
            };
            let mut local: Vec<&mut B::Kv> = caches.iter_mut().map(|c| &mut c.parts[r]).collect();
            b.attention(
                &mut local,
                rs,
                batch,
                &q.parts[r],
                &k.parts[r],
                &v.parts[r],
                &mut out.parts[r],
            )?;
        }
        Ok(())
    }

    fn sigmoid_gate(&self, x: &mut TpAct<B::Act>, g: &TpAct<B::Act>) -> Result<()> {
        if x.split != g.split {
            return Err(Error::Backend(
                "tensor parallelism: gate and attention split differently".into(),
            ));
        }
        for (r, b) in self.ranks.iter().enumerate() {
            b.sigmoid_gate(&mut x.parts[r], &g.parts[r])?;
        }
        Ok(())
    }

    fn swiglu(
        &self,
        gate: &TpAct<B::Act>,
        up: &TpAct<B::Act>,
        out: &mut TpAct<B::Act>,
    ) -> Result<()> {
        if gate.split != up.split {
            return Err(Error::Backend(
                "tensor parallelism: FFN gate and up split differently".into(),
            ));
        }
        self.shape(out, gate.split.clone())?;
        for (r, b) in self.ranks.iter().enumerate() {
            b.swiglu(&gate.parts[r], &up.parts[r], &mut out.parts[r])?;
        }
        Ok(())
    }

    fn ffn_swiglu(
        &self,
        w_gate: &TpMatrix<B::Matrix>,
        w_up: &TpMatrix<B::Matrix>,
        x: &TpAct<B::Act>,
        gate: &mut TpAct<B::Act>,
        up: &mut TpAct<B::Act>,
        out: &mut TpAct<B::Act>,
    ) -> Result<()> {
        // Gate and up split by the same rows over the replicated input: each rank's FFN first
        // half on its own slices (the rank's backend may fuse it); otherwise the composition.
        match (&w_gate.shard, &w_up.shard, &x.split) {
            (Shard::Rows(a), Shard::Rows(b), None) if a == b => {
                for t in [&mut *gate, &mut *up, &mut *out] {
                    self.shape(t, Some(a.clone()))?;
                }
                for (r, b) in self.ranks.iter().enumerate() {
                    b.ffn_swiglu(
                        &w_gate.parts[r],
                        &w_up.parts[r],
                        &x.parts[r],
                        &mut gate.parts[r],
                        &mut up.parts[r],
                        &mut out.parts[r],
                    )?;
                }
                Ok(())
            }
            _ => {
                self.matmul(w_gate, x, gate)?;
                self.matmul(w_up, x, up)?;
                self.swiglu(gate, up, out)
            }
        }
    }

    fn post_norm_add(
        &self,
        resid: &mut TpAct<B::Act>,
        src: &TpAct<B::Act>,
        w: &Vec<B::Vector>,
        eps: f32,
    ) -> Result<()> {
        Self::need_replicated(resid, "the residual stream")?;
        Self::need_replicated(src, "a post norm")?;
        for (r, b) in self.ranks.iter().enumerate() {
            b.post_norm_add(&mut resid.parts[r], &src.parts[r], &w[r], eps)?;
        }
        Ok(())
    }

    fn norm_tail(
        &self,
        resid: &mut TpAct<B::Act>,
        src: &TpAct<B::Act>,
        w_post: &Vec<B::Vector>,
        eps_post: f32,
        w_next: &Vec<B::Vector>,
        eps_next: f32,
        next: &mut TpAct<B::Act>,
    ) -> Result<()> {
        Self::need_replicated(resid, "the residual stream")?;
        Self::need_replicated(src, "the sandwich tail")?;
        self.shape(next, None)?;
        for (r, b) in self.ranks.iter().enumerate() {
            b.norm_tail(
                &mut resid.parts[r],
                &src.parts[r],
                &w_post[r],
                eps_post,
                &w_next[r],
                eps_next,
                &mut next.parts[r],
            )?;
        }
        Ok(())
    }

    fn logit_finish(&self, x: &mut TpAct<B::Act>, scale: f32, softcap: Option<f32>) -> Result<()> {
        for (b, p) in self.ranks.iter().zip(x.parts.iter_mut()) {
            b.logit_finish(p, scale, softcap)?;
        }
        Ok(())
    }

    fn select_rows(
        &self,
        x: &TpAct<B::Act>,
        rows: &[usize],
        out: &mut TpAct<B::Act>,
    ) -> Result<()> {
        self.shape(out, x.split.clone())?;
        for (r, b) in self.ranks.iter().enumerate() {
            b.select_rows(&x.parts[r], rows, &mut out.parts[r])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::reference_layer_kinds;
    use crate::loader::{LayerTensors, Tensors};
    use muser_gguf::GgmlType;

    /// The released 30B's shapes in llama.cpp's Q4_K_M mix (Q6_K ffn_down on some layers).
    fn muse_30b() -> (MuseConfig, Tensors) {
        let c = MuseConfig {
            n_vocab: 202_048,
            n_ctx_train: 131_072,
            n_embd: 6656,
            n_ff: 19968,
            n_layer: 52,
            n_head: 32,
            n_head_kv: 2,
            head_dim: 128,
            rms_eps: 1e-5,
            n_swa: 2048,
            layer_kinds: reference_layer_kinds(52),
            rope_freq_base: 5e5,
            rope_freq_base_swa: 5e5,
            logit_scale: 0.196,
            softcap: Some(20.0),
        };
        let m = |name: &str, ty, rows, cols| Matrix::detached(name, ty, rows, cols).unwrap();
        let layers = (0..52)
            .map(|i| LayerTensors {
                attn_norm: vec![],
                attn_q: m("attn_q", GgmlType::Q4_K, 4096, 6656),
                attn_k: m("attn_k", GgmlType::Q4_K, 256, 6656),
                attn_v: m("attn_v", GgmlType::Q6_K, 256, 6656),
                attn_gate: m("attn_gate", GgmlType::Q4_K, 4096, 6656),
                attn_output: m("attn_output", GgmlType::Q4_K, 6656, 4096),
                qk_scale: 3.87,
                post_attention_norm: vec![],
                ffn_norm: vec![],
                ffn_gate: m("ffn_gate", GgmlType::Q4_K, 19968, 6656),
                ffn_up: m("ffn_up", GgmlType::Q4_K, 19968, 6656),
                ffn_down: m(
                    "ffn_down",
                    if i % 3 == 0 {
                        GgmlType::Q6_K
                    } else {
                        GgmlType::Q4_K
                    },
                    6656,
                    19968,
                ),
                post_ffw_norm: vec![],
            })
            .collect();
        let t = Tensors {
            token_embd: m("token_embd", GgmlType::Q4_K, 202_048, 6656),
            output_norm: vec![],
            output: m("output", GgmlType::Q6_K, 202_048, 6656),
            layers,
        };
        (c, t)
    }

    #[test]
    fn the_30b_splits_over_1_2_4_and_8_ranks() {
        let (c, t) = muse_30b();
        for world in [1, 2, 4, 8] {
            let p = ShardPlan::new(&c, &t, world).unwrap();
            assert_eq!(p.heads.iter().map(|h| h.len()).sum::<usize>(), 32);
            assert_eq!(p.ff.last().unwrap().end, 19968);
            assert!(
                p.ff.iter().all(|r| r.start % 256 == 0 && r.end % 256 == 0),
                "whole Q4_K/Q6_K blocks"
            );
            assert_eq!(p.vocab.last().unwrap().end, 202_048);
            // Every rank's query heads read only the KV heads it holds.
            for (h, g) in p.heads.iter().zip(&p.kv_heads) {
                assert!(h.clone().all(|q| g.contains(&(q / 16))));
            }
            let kv_total: usize = p.kv_heads.iter().map(|g| g.len()).sum();
            assert_eq!(
                kv_total,
                world.max(2),
                "split at 1-2 ranks, replicated beyond"
            );
        }
        // 19968 = 78 blocks of 256: four ranks get 20, 20, 19, 19.
        let p = ShardPlan::new(&c, &t, 4).unwrap();
        assert_eq!(
            p.ff.iter().map(|r| r.len() / 256).collect::<Vec<_>>(),
            vec![20, 20, 19, 19]
        );
        assert!(ShardPlan::new(&c, &t, 3).is_err(), "32 heads over 3 ranks");
        assert!(
            ShardPlan::new(&c, &t, 64).is_err(),
            "more ranks than query heads"
        );
    }
}
