//! Tensor parallelism's recorded steps (`TpBackend::step_record` .. `record_end`), with CPU ranks
//! whose answers are scripted: the ranks' recordings run only when every rank kept its own (on
//! GPUs a rank's graph holds its NCCL calls and, launched alone, would wait for the others
//! forever), ranks that disagree run the step eagerly, a rank that cannot begin recording leaves
//! none recording. Whatever the script, the logits are the plain ranks' to the bit.
//!
//! A scripted rank is a CPU backend whose "recording" runs the operations as they come (it
//! cannot replay), so a step it records has run once already. A GPU's recording runs nothing
//! until `record_run`; so when this rank's recording does not run (dropped by it or by another
//! rank), the K and V rows it appended are taken back before the step runs again eagerly (the
//! NoPE planes grow in position order).

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use muser_engine::backend::{AttnSpec, Backend, Batch, StepRecord};
use muser_engine::kv::{KvType, LayerCache};
use muser_engine::loader::Matrix;
use muser_engine::tp::{ShardPlan, TpBackend};
use muser_engine::{CpuBackend, Logits, ModelFile, MuseConfig, MuseGlimmer, NumericMode, Session};
use muser_gguf::Gguf;

/// What a scripted rank answers, and what it was asked.
#[derive(Clone)]
struct Script {
    mode: StepRecord,
    keep: bool,
    begin_fails: bool,
}

struct Scripted {
    cpu: CpuBackend,
    script: Script,
    log: Mutex<Vec<&'static str>>,
    /// At `record_begin`: each cache's NoPE plane lengths (bytes of K per layer).
    planes: Mutex<Vec<Vec<usize>>>,
    /// A recording that did not run: its rows are still to be taken back (at the next attention).
    undo: Mutex<bool>,
}

impl Scripted {
    fn new(script: Script) -> Self {
        Scripted {
            cpu: CpuBackend::new(NumericMode::Accurate, 1).unwrap(),
            script,
            log: Mutex::new(Vec::new()),
            planes: Mutex::new(Vec::new()),
            undo: Mutex::new(false),
        }
    }
    fn note(&self, what: &'static str) {
        self.log.lock().unwrap().push(what);
    }
    fn calls(&self) -> Vec<&'static str> {
        self.log.lock().unwrap().clone()
    }
}

type Cpu = CpuBackend;
type R<T> = muser_engine::Result<T>;

impl Backend for Scripted {
    type Matrix = <Cpu as Backend>::Matrix;
    type Vector = <Cpu as Backend>::Vector;
    type Act = <Cpu as Backend>::Act;
    type Kv = <Cpu as Backend>::Kv;

    fn name(&self) -> String {
        "scripted cpu".into()
    }
    fn step_record(&self, _b: &Batch, _c: &mut [&mut Self::Kv], _ws: u64) -> R<StepRecord> {
        self.note("ask");
        Ok(self.script.mode)
    }
    fn step_ran(&self, ok: bool) {
        self.note(if ok { "ran" } else { "ran-failed" });
    }
    fn record_begin(&self, _b: &Batch, caches: &mut [&mut Self::Kv]) -> R<()> {
        self.note("begin");
        *self.planes.lock().unwrap() = caches
            .iter()
            .map(|c| {
                c.layers
                    .iter()
                    .map(|l| match l {
                        LayerCache::Plane { k, .. } => k.len(),
                        LayerCache::Ring { .. } => 0,
                    })
                    .collect()
            })
            .collect();
        if self.script.begin_fails {
            return Err(muser_engine::Error::Backend(
                "scripted: cannot record".into(),
            ));
        }
        Ok(())
    }
    fn record_close(&self, ok: bool) -> R<bool> {
        self.note("close");
        // Until `record_run`, the recording has not run: on a GPU nothing it holds has touched
        // the caches yet.
        *self.undo.lock().unwrap() = true;
        Ok(ok && self.script.keep)
    }
    fn record_run(&self) -> R<()> {
        self.note("run");
        *self.undo.lock().unwrap() = false;
        Ok(())
    }
    fn record_replay(&self, _b: &Batch, _c: &mut [&mut Self::Kv]) -> R<()> {
        self.note("replay");
        Err(muser_engine::Error::Backend(
            "scripted: a CPU rank cannot replay".into(),
        ))
    }

    fn max_sequences_per_batch(&self) -> usize {
        self.cpu.max_sequences_per_batch()
    }
    fn draws_on_device(&self) -> bool {
        self.cpu.draws_on_device()
    }
    fn matrix(&self, file: &Arc<Gguf>, m: &Matrix) -> R<Self::Matrix> {
        self.cpu.matrix(file, m)
    }
    fn matrix_from_bytes(&self, m: &Matrix, bytes: &[u8]) -> R<Self::Matrix> {
        self.cpu.matrix_from_bytes(m, bytes)
    }
    fn vector(&self, v: &[f32]) -> R<Self::Vector> {
        self.cpu.vector(v)
    }
    fn act(&self, rows: usize, cols: usize) -> R<Self::Act> {
        self.cpu.act(rows, cols)
    }
    fn set_rows(&self, a: &mut Self::Act, rows: usize) -> R<()> {
        self.cpu.set_rows(a, rows)
    }
    fn kv_cache(&self, cfg: &MuseConfig, ty: KvType, n_ctx: usize) -> R<Self::Kv> {
        self.cpu.kv_cache(cfg, ty, n_ctx)
    }
    fn kv_capacity(&self, kv: &Self::Kv) -> usize {
        self.cpu.kv_capacity(kv)
    }
    fn kv_len(&self, kv: &Self::Kv) -> usize {
        self.cpu.kv_len(kv)
    }
    fn kv_set_len(&self, kv: &mut Self::Kv, len: usize) {
        self.cpu.kv_set_len(kv, len)
    }
    fn kv_clear(&self, kv: &mut Self::Kv) {
        self.cpu.kv_clear(kv)
    }
    fn write(&self, a: &mut Self::Act, values: &[f32]) -> R<()> {
        self.cpu.write(a, values)
    }
    fn read(&self, a: &Self::Act) -> R<Vec<f32>> {
        self.cpu.read(a)
    }
    fn read_into(&self, a: &Self::Act, out: &mut Vec<f32>) -> R<()> {
        self.cpu.read_into(a, out)
    }
    fn begin_batch(&self, batch: &Batch) -> R<()> {
        self.cpu.begin_batch(batch)
    }
    fn get_rows(&self, table: &Self::Matrix, tokens: &[u32], out: &mut Self::Act) -> R<()> {
        self.cpu.get_rows(table, tokens, out)
    }
    fn rms_norm(
        &self,
        x: &Self::Act,
        w: Option<&Self::Vector>,
        eps: f32,
        out: &mut Self::Act,
    ) -> R<()> {
        self.cpu.rms_norm(x, w, eps, out)
    }
    fn matmul(&self, w: &Self::Matrix, x: &Self::Act, out: &mut Self::Act) -> R<()> {
        self.cpu.matmul(w, x, out)
    }
    fn head_norm(&self, x: &mut Self::Act, head_dim: usize, eps: f32, scale: f32) -> R<()> {
        self.cpu.head_norm(x, head_dim, eps, scale)
    }
    fn rope(&self, x: &mut Self::Act, head_dim: usize, batch: &Batch, base: f32) -> R<()> {
        self.cpu.rope(x, head_dim, batch, base)
    }
    fn attention(
        &self,
        caches: &mut [&mut Self::Kv],
        spec: AttnSpec,
        batch: &Batch,
        q: &Self::Act,
        k: &Self::Act,
        v: &Self::Act,
        out: &mut Self::Act,
    ) -> R<()> {
        if std::mem::take(&mut *self.undo.lock().unwrap()) {
            let planes = self.planes.lock().unwrap();
            for (c, lens) in caches.iter_mut().zip(planes.iter()) {
                for (l, &n) in c.layers.iter_mut().zip(lens) {
                    if let LayerCache::Plane { k, v } = l {
                        k.truncate(n);
                        v.truncate(n);
                    }
                }
            }
        }
        self.cpu.attention(caches, spec, batch, q, k, v, out)
    }
    fn sigmoid_gate(&self, x: &mut Self::Act, g: &Self::Act) -> R<()> {
        self.cpu.sigmoid_gate(x, g)
    }
    fn swiglu(&self, gate: &Self::Act, up: &Self::Act, out: &mut Self::Act) -> R<()> {
        self.cpu.swiglu(gate, up, out)
    }
    fn post_norm_add(
        &self,
        resid: &mut Self::Act,
        src: &Self::Act,
        w: &Self::Vector,
        eps: f32,
    ) -> R<()> {
        self.cpu.post_norm_add(resid, src, w, eps)
    }
    fn logit_finish(&self, x: &mut Self::Act, scale: f32, softcap: Option<f32>) -> R<()> {
        self.cpu.logit_finish(x, scale, softcap)
    }
    fn select_rows(&self, x: &Self::Act, rows: &[usize], out: &mut Self::Act) -> R<()> {
        self.cpu.select_rows(x, rows, out)
    }
}

const FIXTURE: &str = "tame-f32";

fn file() -> ModelFile {
    ModelFile::open(model_path(FIXTURE)).unwrap()
}

/// The prompt's logits (every row: the step is asked about), then 4 decode steps' (one row each:
/// asked too), or the first error.
fn run<B: Backend>(m: &MuseGlimmer<B>) -> muser_engine::Result<Vec<f32>> {
    let tokens = read_i32(&golden_path(FIXTURE, "tokens.i32"));
    let mut s = Session::new(m, KvType::F32, 256)?;
    let mut out = s.feed(&tokens[..16], 512, Logits::All)?;
    for &t in &tokens[16..20] {
        out.extend(s.feed(&[t], 1, Logits::Last)?);
    }
    Ok(out)
}

fn plain() -> Vec<f32> {
    let f = file();
    let plan = ShardPlan::new(&f.config, &f.tensors, 2).unwrap();
    let ranks = (0..2)
        .map(|_| CpuBackend::new(NumericMode::Accurate, 1).unwrap())
        .collect();
    let m = MuseGlimmer::load(&f, TpBackend::new(ranks, plan).unwrap()).unwrap();
    run(&m).unwrap()
}

fn scripted(a: Script, b: Script) -> MuseGlimmer<TpBackend<Scripted>> {
    let f = file();
    let plan = ShardPlan::new(&f.config, &f.tensors, 2).unwrap();
    let ranks = vec![Scripted::new(a), Scripted::new(b)];
    MuseGlimmer::load(&f, TpBackend::new(ranks, plan).unwrap()).unwrap()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Two scripted ranks, run (`run`); their logits must be `want`'s bits.
fn scripted_run(a: Script, b: Script, want: &[f32]) -> MuseGlimmer<TpBackend<Scripted>> {
    let m = scripted(a, b);
    let got = run(&m).unwrap();
    assert!(same_bits(&got, want), "logits differ from the plain ranks'");
    m
}

/// How many times `calls` holds `what`.
fn count(calls: &[&str], what: &str) -> usize {
    calls.iter().filter(|&&c| c == what).count()
}

const RECORD_KEEP: Script = Script {
    mode: StepRecord::Record,
    keep: true,
    begin_fails: false,
};

#[test]
fn ranks_that_disagree_run_the_step_eagerly() {
    let want = plain();
    let replay = Script {
        mode: StepRecord::Replay,
        ..RECORD_KEEP
    };
    let eager = Script {
        mode: StepRecord::Eager,
        ..RECORD_KEEP
    };
    let m = scripted_run(replay, eager, &want);
    for (r, b) in m.backend.ranks.iter().enumerate() {
        let calls = b.calls();
        assert_eq!(count(&calls, "ask"), 5, "rank {r}: {calls:?}");
        assert!(
            !calls
                .iter()
                .any(|&c| c == "replay" || c == "begin" || c == "run"),
            "rank {r} recorded or replayed alone: {calls:?}"
        );
        // Told its answer was not followed (no warm-up taken from this step).
        assert!(calls.contains(&"ran-failed"), "rank {r}: {calls:?}");
    }
}

#[test]
fn recordings_run_only_when_every_rank_kept_its_own() {
    let want = plain();
    // Rank 1 drops its recording: rank 0's must not run alone; the step runs again eagerly.
    let dropped = Script {
        keep: false,
        ..RECORD_KEEP
    };
    let m = scripted_run(RECORD_KEEP, dropped, &want);
    for (r, b) in m.backend.ranks.iter().enumerate() {
        let calls = b.calls();
        assert_eq!(count(&calls, "begin"), 5, "rank {r}: {calls:?}");
        assert_eq!(count(&calls, "close"), 5, "rank {r}: {calls:?}");
        assert!(
            !calls.contains(&"run"),
            "rank {r} ran a recording alone: {calls:?}"
        );
    }
    // Both keep: both recordings run, every step but the first. The first step of a workspace
    // gives its activations their splits (new buffers), which a recording must not do: it fails
    // the recording (TpBackend::shape), and the step runs again eagerly.
    let m = scripted_run(RECORD_KEEP, RECORD_KEEP, &want);
    let mut expected = vec!["ask", "begin", "close"];
    for _ in 0..4 {
        expected.extend(["ask", "begin", "close", "run"]);
    }
    for (r, b) in m.backend.ranks.iter().enumerate() {
        assert_eq!(b.calls(), expected, "rank {r}");
    }
}

#[test]
fn a_rank_that_cannot_record_leaves_none_recording() {
    let fails = Script {
        begin_fails: true,
        ..RECORD_KEEP
    };
    let m = scripted(RECORD_KEEP, fails);
    let err = run(&m).expect_err("the step must fail");
    assert!(err.to_string().contains("cannot record"), "{err}");
    let first = m.backend.ranks[0].calls();
    // Rank 0 began, then had its recording closed (kept: no) before the error came back.
    assert_eq!(first, vec!["ask", "begin", "close"], "rank 0: {first:?}");
    assert_eq!(m.backend.ranks[1].calls(), vec!["ask", "begin"]);
}
