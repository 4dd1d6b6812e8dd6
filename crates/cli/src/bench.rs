//! `muser bench`: prompt and decode throughput, measured like llama-bench's pp/tg tests
//! (prompt: random tokens into an empty cache in micro-batches of `--ubatch`, llama-bench's
//! default 512; decode: single tokens after
//! `--depth` tokens of context), median of repetitions after a warm-up. On CUDA the decode
//! step is a captured graph (one launch per token) unless `--no-graph`.

use std::time::Instant;

use muser_cuda::graph::GraphDecoder;
use muser_engine::sampling::{NOT_FINITE, Rng, RowDraw};
use muser_engine::{Backend, KvType, Logits, MuseGlimmer, Session};

use crate::common::{CliResult, Loaded, ModelOpts};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelOpts,
    /// Prompt lengths to test (0 skips).
    #[arg(
        short = 'p',
        long = "n-prompt",
        default_value = "128",
        value_delimiter = ','
    )]
    pub n_prompt: Vec<usize>,
    /// Tokens to generate in the decode test (0 skips).
    #[arg(short = 'n', long = "n-gen", default_value_t = 32)]
    pub n_gen: usize,
    /// Context already in the cache before the decode test (comma-separated list).
    #[arg(long = "depth", default_value = "0", value_delimiter = ',')]
    pub depth: Vec<usize>,
    /// Repetitions (median reported).
    #[arg(short = 'r', long, default_value_t = 3)]
    pub reps: usize,
    /// Micro-batch for prompts and for filling the context before a decode test.
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
    /// CUDA: launch kernel by kernel instead of replaying a captured graph.
    #[arg(long)]
    pub no_graph: bool,
    /// CUDA: time every operation of a few eager decode steps and print where the time goes.
    #[arg(long)]
    pub profile: bool,
    /// Batched test, like `llama-batched-bench -npp P -ntg G -npl N`: N sequences each get a
    /// prompt of `--batch-prompt` tokens, then `--batch-gen` steps advance all N at once
    /// (comma-separated list of N; empty skips).
    #[arg(long = "parallel", value_delimiter = ',')]
    pub parallel: Vec<usize>,
    /// Prompt tokens per sequence in the batched test.
    #[arg(long = "batch-prompt", default_value_t = 512)]
    pub batch_prompt: usize,
    /// Tokens generated per sequence in the batched test.
    #[arg(long = "batch-gen", default_value_t = 128)]
    pub batch_gen: usize,
    /// Batched test: each step chooses every sequence's next token where the logits are (greedy,
    /// on the GPU for CUDA) and feeds it to the next step, as `muser serve` does, instead of
    /// copying every sequence's logits to the host (as llama-batched-bench does).
    #[arg(long = "batch-draw")]
    pub batch_draw: bool,
    /// Batched test: each sequence's cache holds this many positions, as `muser serve
    /// --ctx-size` gives every slot (0: just what the test needs, prompt + generated tokens).
    /// The attention's launches are sized by the caches' capacity.
    #[arg(long = "batch-ctx", default_value_t = 0)]
    pub batch_ctx: usize,
}

/// What the batched test runs: `npl` sequences, `npp` prompt tokens each (micro-batches of
/// `ubatch`), `ntg` steps; `draw`: tokens chosen on the backend (`--batch-draw`).
struct BatchShape {
    npl: usize,
    npp: usize,
    ntg: usize,
    ubatch: usize,
    draw: bool,
    /// Positions per cache (0: npp + ntg and what the test adds).
    ctx: usize,
}

/// The batched test: every sequence's prompt, in micro-batches of `ubatch` tokens that mix
/// sequences (as many as the backend allows per call), then `ntg` steps of one token for each
/// sequence in one micro-batch, with every sequence's logits copied to the host each step (as
/// llama.cpp does for its outputs), or with `draw` its greedy token chosen on the backend and fed
/// to the next step. Returns (prompt seconds, generation seconds).
fn batched_test<B: Backend>(
    m: &MuseGlimmer<B>,
    kv: KvType,
    shape: &BatchShape,
    profile: Option<&dyn Fn(usize)>,
) -> Result<(f64, f64), muser_engine::Error> {
    use muser_engine::backend::Batch;
    let &BatchShape {
        npl,
        npp,
        ntg,
        ubatch,
        draw,
        ctx,
    } = shape;
    // With `profile`: 2 x PROFILE_STEPS more steps, untimed; `profile(k)` is called before
    // pass k = 0, 1 of PROFILE_STEPS steps and after the last (k = 2).
    let extra = if profile.is_some() {
        2 * PROFILE_STEPS
    } else {
        0
    };
    let max_seqs = m
        .backend
        .max_sequences_per_batch()
        .min(m.backend.max_batch_tokens())
        .max(1);
    if npl > max_seqs {
        return Err(muser_engine::Error::Input(format!(
            "{npl} sequences: the backend takes at most {max_seqs} per micro-batch"
        )));
    }
    if ctx > m.config.n_ctx_train {
        return Err(muser_engine::Error::Input(format!(
            "--batch-ctx {ctx}: the model's context is {} positions",
            m.config.n_ctx_train
        )));
    }
    let ubatch = ubatch.min(m.backend.max_batch_tokens()).max(1);
    let mut rng = Rng::new(3);
    let mut caches = (0..npl)
        .map(|_| m.new_cache(kv, ctx.max(npp + ntg + extra + 1)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ws = m.workspace(ubatch.max(npl))?;
    let prompts: Vec<Vec<u32>> = (0..npl)
        .map(|_| random_tokens(&mut rng, npp, m.config.n_vocab))
        .collect();
    let all: Vec<(usize, u32, u32)> = prompts
        .iter()
        .enumerate()
        .flat_map(|(s, p)| p.iter().enumerate().map(move |(i, &t)| (s, i as u32, t)))
        .collect();
    // One logits buffer for every step, as a server keeps one (llama.cpp's batched bench too).
    let mut logits = Vec::new();
    let t = Instant::now();
    for chunk in all.chunks(ubatch.max(1)) {
        let batch = Batch {
            tokens: chunk.iter().map(|c| c.2).collect(),
            pos: chunk.iter().map(|c| c.1).collect(),
            seq: chunk.iter().map(|c| c.0).collect(),
        };
        let mut refs: Vec<&mut B::Kv> = caches.iter_mut().collect();
        // The last row's logits: the copy waits for the micro-batch to finish.
        m.forward_into(&mut ws, &batch, &mut refs, &[batch.len() - 1], &mut logits)?;
    }
    let t_pp = t.elapsed().as_secs_f64();
    // One step: every sequence advances by a random token at position npp + step.
    let rows: Vec<usize> = (0..npl).collect();
    let greedy: Vec<RowDraw> = (0..npl).map(|_| RowDraw::default()).collect();
    let mut drawn: Vec<u32> = Vec::new();
    let mut decode_step = |step: usize| -> Result<(), muser_engine::Error> {
        let tokens = if draw && drawn.len() == npl {
            std::mem::take(&mut drawn)
        } else {
            (0..npl)
                .map(|_| random_tokens(&mut rng, 1, m.config.n_vocab)[0])
                .collect()
        };
        let batch = Batch {
            tokens,
            pos: vec![(npp + step) as u32; npl],
            seq: (0..npl).collect(),
        };
        let mut refs: Vec<&mut B::Kv> = caches.iter_mut().collect();
        if draw {
            m.forward_device(&mut ws, &batch, &mut refs, &rows)?;
            m.draw_logit_rows(&mut ws, &rows, &greedy, &mut drawn)?;
            // A row whose logits are not finite draws no token (NOT_FINITE): say so here, where
            // the next step would refuse the id as outside the vocabulary.
            if drawn.contains(&NOT_FINITE) {
                return Err(muser_engine::Error::Tensor(format!(
                    "the model's logits are not finite at position {}: its weights or scales overflow f32 (a damaged file?)",
                    npp + step
                )));
            }
            Ok(())
        } else {
            m.forward_into(&mut ws, &batch, &mut refs, &rows, &mut logits)
        }
    };
    let t = Instant::now();
    for step in 0..ntg {
        decode_step(step)?;
    }
    let t_tg = t.elapsed().as_secs_f64();
    if let Some(phase) = profile {
        for step in ntg..ntg + extra {
            if (step - ntg) % PROFILE_STEPS == 0 {
                phase((step - ntg) / PROFILE_STEPS);
            }
            decode_step(step)?;
        }
        phase(2);
    }
    Ok((t_pp, t_tg))
}

/// Steps profiled after a batched test (`--profile`).
const PROFILE_STEPS: usize = 2;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn random_tokens(rng: &mut Rng, n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|_| (rng.next_u64() % n_vocab as u64) as u32)
        .collect()
}

fn prompt_test<B: Backend>(
    m: &MuseGlimmer<B>,
    kv: KvType,
    np: usize,
    reps: usize,
    ubatch: usize,
) -> Result<f64, muser_engine::Error> {
    let n_ctx = m.config.n_ctx_train;
    if np == 0 || np > n_ctx {
        // Before the prompt's tokens are made: -p 10^11 is named, not allocated.
        return Err(muser_engine::Error::Input(format!(
            "-p {np}: a prompt test takes 1 to {n_ctx} tokens (the model's context)"
        )));
    }
    let toks = random_tokens(&mut Rng::new(1), np, m.config.n_vocab);
    let mut times = Vec::new();
    for rep in 0..=reps.max(1) {
        let mut s = Session::new(m, kv, np)?;
        let t = Instant::now();
        s.feed(&toks, ubatch.min(np), Logits::Last)?;
        if rep > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(median(times))
}

/// The cache of a decode test: `depth` random tokens fed once (micro-batches of `--ubatch`),
/// then room for every repetition's tokens, which follow one another (repetition k decodes
/// positions depth + k (n_gen + 2) onward: a few hundred positions past `depth` at most, so a
/// deep context is filled once, not once per repetition).
fn decode_session<'m, B: Backend>(
    m: &'m MuseGlimmer<B>,
    kv: KvType,
    a: &Args,
    depth: usize,
) -> Result<(Session<'m, B>, u32), muser_engine::Error> {
    let n_ctx = m.config.n_ctx_train;
    let need = (a.reps.max(1) + 1)
        .checked_mul(a.n_gen.saturating_add(2))
        .and_then(|n| n.checked_add(depth))
        .filter(|&n| n <= n_ctx)
        .ok_or_else(|| {
            muser_engine::Error::Input(format!(
                "--depth {depth} with -n {} and -r {}: the test needs more than the model's {n_ctx} positions",
                a.n_gen, a.reps
            ))
        })?;
    let mut rng = Rng::new(2);
    let pre = random_tokens(&mut rng, depth, m.config.n_vocab);
    let mut s = Session::new(m, kv, need)?;
    let mut tok = 1u32;
    if depth > 0 {
        let l = s.feed(&pre, a.ubatch, Logits::Last)?;
        tok = muser_engine::sampling::argmax(&l) as u32;
    }
    Ok((s, tok))
}

fn decode_test<B: Backend>(
    m: &MuseGlimmer<B>,
    kv: KvType,
    a: &Args,
    depth: usize,
) -> Result<f64, muser_engine::Error> {
    let (mut s, _) = decode_session(m, kv, a, depth)?;
    let mut rng = Rng::new(3);
    let toks = random_tokens(&mut rng, a.n_gen, m.config.n_vocab);
    let mut times = Vec::new();
    for rep in 0..=a.reps.max(1) {
        let t = Instant::now();
        for &tok in &toks {
            s.feed(&[tok], 1, Logits::Last)?;
        }
        if rep > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(median(times))
}

fn decode_test_graph(
    m: &MuseGlimmer<muser_cuda::CudaBackend>,
    kv: KvType,
    a: &Args,
    depth: usize,
) -> Result<f64, muser_engine::Error> {
    let (mut s, mut tok) = decode_session(m, kv, a, depth)?;
    let mut dec = GraphDecoder::new(m)?;
    dec.use_graph = !a.no_graph;
    dec.reset();
    // The cache's first step runs eagerly and its second captures the graph: keep both out of
    // the timing.
    tok = dec.step(&mut s.kv, tok, None)?;
    tok = dec.step(&mut s.kv, tok, None)?;
    let mut times = Vec::new();
    for rep in 0..=a.reps.max(1) {
        m.backend.sync()?;
        let t = Instant::now();
        for _ in 0..a.n_gen {
            tok = dec.step(&mut s.kv, tok, None)?;
        }
        m.backend.sync()?;
        if rep > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(median(times))
}

fn profile_decode(
    m: &MuseGlimmer<muser_cuda::CudaBackend>,
    kv: KvType,
    steps: usize,
) -> Result<(), muser_engine::Error> {
    let mut s = Session::new(m, kv, steps + 2)?;
    let mut dec = GraphDecoder::new(m)?;
    dec.use_graph = false;
    let mut tok = dec.step(&mut s.kv, 1, None)?; // warm-up, not timed
    m.backend.set_profiling(true);
    for _ in 0..steps {
        tok = dec.step(&mut s.kv, tok, None)?;
    }
    print_profile(m, &format!("per decode step (eager, {steps} steps)"), steps)
}

/// The profile gathered since profiling was turned on, per step, by operation; turns it off.
fn print_profile(
    m: &MuseGlimmer<muser_cuda::CudaBackend>,
    what: &str,
    steps: usize,
) -> Result<(), muser_engine::Error> {
    let report = m.backend.profile_report()?;
    m.backend.set_profiling(false);
    let total: f64 = report
        .iter()
        .filter(|r| !r.0.starts_with(muser_cuda::INNER_LABEL))
        .map(|r| r.2)
        .sum();
    println!("\n{what}, GPU time by operation:");
    println!("| op | calls/step | ms/step | share |");
    println!("|---|---|---|---|");
    for (label, n, ms) in &report {
        println!(
            "| {label} | {} | {:.3} | {:.1}% |",
            n / steps,
            ms / steps as f64,
            100.0 * ms / total
        );
    }
    println!("| total | | {:.3} | |", total / steps as f64);
    Ok(())
}

pub fn run(a: Args) -> CliResult {
    // The cache type first: a bad --kv-type is named before the weights load.
    let kv = a.model.kv()?;
    let loaded = a.model.load()?;
    let backend_name = crate::with_model!(&loaded, m => m.backend.name());
    println!(
        "model: {}  backend: {backend_name}  kv: {}  mode: {}",
        a.model.model_name(),
        kv.name(),
        a.model.mode
    );
    println!("| test | tokens/s | ms/token |");
    println!("|---|---|---|");
    for &np in a.n_prompt.iter().filter(|&&n| n > 0) {
        let t = crate::with_model!(&loaded, m => prompt_test(m, kv, np, a.reps, a.ubatch)?);
        println!(
            "| pp{np} | {:.2} | {:.3} |",
            np as f64 / t,
            t * 1e3 / np as f64
        );
    }
    if a.n_gen > 0 {
        for &depth in &a.depth {
            let t = match &loaded {
                Loaded::Cpu(m) => decode_test(m, kv, &a, depth)?,
                Loaded::Cuda(m) => decode_test_graph(m, kv, &a, depth)?,
                Loaded::TpCpu(m) => decode_test(m, kv, &a, depth)?,
                Loaded::TpCuda(m) => decode_test(m, kv, &a, depth)?,
            };
            let at = if depth > 0 {
                format!(" @ d{depth}")
            } else {
                String::new()
            };
            println!(
                "| tg{}{at} | {:.2} | {:.3} |",
                a.n_gen,
                a.n_gen as f64 / t,
                t * 1e3 / a.n_gen as f64
            );
        }
    }
    for &npl in a.parallel.iter().filter(|&&n| n > 0) {
        let shape = BatchShape {
            npl,
            npp: a.batch_prompt,
            ntg: a.batch_gen,
            ubatch: a.ubatch,
            draw: a.batch_draw,
            ctx: a.batch_ctx,
        };
        let (tp, tg) = match &loaded {
            Loaded::Cuda(m) if a.profile => {
                // Two passes: as the steps run, then each operation alone (the stream drained
                // first: its kernels plus its own launch work, nothing queued ahead).
                let phase = |k: usize| {
                    if k > 0 {
                        let what = if k == 1 {
                            format!(
                                "per batched step of {npl} sequences (eager, {PROFILE_STEPS} steps)"
                            )
                        } else {
                            format!(
                                "per batched step of {npl} sequences, each operation alone (stream drained before it)"
                            )
                        };
                        if let Err(e) = print_profile(m, &what, PROFILE_STEPS) {
                            eprintln!("profile: {e}");
                        }
                    }
                    m.backend.set_profile_sync(k == 1);
                    m.backend.set_profiling(k < 2);
                };
                batched_test(m, kv, &shape, Some(&phase))?
            }
            _ => {
                crate::with_model!(&loaded, m => batched_test(m, kv, &shape, None)?)
            }
        };
        println!(
            "| pp{} x{npl} | {:.2} | {:.3} |",
            a.batch_prompt,
            (npl * a.batch_prompt) as f64 / tp,
            tp * 1e3 / (npl * a.batch_prompt) as f64
        );
        println!(
            "| tg{} x{npl} (aggregate{}) | {:.2} | {:.3} |",
            a.batch_gen,
            if a.batch_draw {
                ", tokens drawn on the backend"
            } else {
                ""
            },
            (npl * a.batch_gen) as f64 / tg,
            tg * 1e3 / (npl * a.batch_gen) as f64
        );
    }
    if a.profile {
        if let Loaded::Cuda(m) = &loaded {
            profile_decode(m, kv, 4)?;
            if let Some(&np) = a.n_prompt.iter().find(|&&n| n > 0) {
                profile_prompt(m, kv, np, a.ubatch)?;
            }
        }
    }
    Ok(())
}

/// One prompt of `np` tokens (micro-batches of `ubatch`) with every operation timed (CUDA
/// events, eager), after one untimed prompt that makes the buffers.
fn profile_prompt(
    m: &MuseGlimmer<muser_cuda::CudaBackend>,
    kv: KvType,
    np: usize,
    ubatch: usize,
) -> Result<(), muser_engine::Error> {
    let toks = random_tokens(&mut Rng::new(1), np, m.config.n_vocab);
    Session::new(m, kv, np)?.feed(&toks, ubatch.min(np), Logits::Last)?;
    let mut s = Session::new(m, kv, np)?;
    m.backend.set_profiling(true);
    s.feed(&toks, ubatch.min(np), Logits::Last)?;
    print_profile(
        m,
        &format!("per prompt of {np} tokens (micro-batches of {ubatch})"),
        1,
    )
}
