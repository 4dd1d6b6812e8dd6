//! `muser bench`: prompt and decode throughput, measured like llama-bench's pp/tg tests
//! (prompt: one micro-batch of random tokens into an empty cache; decode: single tokens from
//! an empty cache), median of repetitions after a warm-up.

use std::time::Instant;

use muser_engine::sampling::Rng;
use muser_engine::{Backend, Logits, Session};

use crate::common::{CliResult, ModelOpts};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelOpts,
    /// Prompt lengths to test (0 skips).
    #[arg(short = 'p', long = "n-prompt", default_value = "128", value_delimiter = ',')]
    pub n_prompt: Vec<usize>,
    /// Tokens to generate in the decode test (0 skips).
    #[arg(short = 'n', long = "n-gen", default_value_t = 32)]
    pub n_gen: usize,
    /// Context already in the cache before the decode test.
    #[arg(long = "depth", default_value_t = 0)]
    pub depth: usize,
    /// Repetitions (median reported).
    #[arg(short = 'r', long, default_value_t = 3)]
    pub reps: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(a: Args) -> CliResult {
    let model = a.model.load()?;
    let kv = a.model.kv()?;
    let n_vocab = model.config.n_vocab as u64;
    let mut rng = Rng::new(1);
    let mut tokens = |n: usize| -> Vec<u32> { (0..n).map(|_| (rng.next_u64() % n_vocab) as u32).collect() };
    println!("model: {}  backend: {}  kv: {}", a.model.model.display(), model.backend.name(), kv.name());
    println!("| test | tokens/s | ms/token |");
    println!("|---|---|---|");
    for &np in a.n_prompt.iter().filter(|&&n| n > 0) {
        let toks = tokens(np);
        let mut times = Vec::new();
        for rep in 0..=a.reps.max(1) {
            let mut s = Session::new(&model, kv, np)?;
            let t = Instant::now();
            s.feed(&toks, np, Logits::Last)?;
            if rep > 0 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        let t = median(times);
        println!("| pp{np} | {:.2} | {:.2} |", np as f64 / t, t * 1e3 / np as f64);
    }
    if a.n_gen > 0 {
        let pre = tokens(a.depth);
        let decode_tokens = tokens(a.n_gen);
        let mut times = Vec::new();
        for rep in 0..=a.reps.max(1) {
            let mut s = Session::new(&model, kv, a.depth + a.n_gen)?;
            if a.depth > 0 {
                s.feed(&pre, 512, Logits::Last)?;
            }
            let t = Instant::now();
            for &tok in &decode_tokens {
                s.feed(&[tok], 1, Logits::Last)?;
            }
            if rep > 0 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        let t = median(times);
        let at = if a.depth > 0 { format!(" @ d{}", a.depth) } else { String::new() };
        println!("| tg{}{at} | {:.2} | {:.2} |", a.n_gen, a.n_gen as f64 / t, t * 1e3 / a.n_gen as f64);
    }
    Ok(())
}
