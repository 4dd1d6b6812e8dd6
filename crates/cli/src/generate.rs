//! `muser generate`: continue a prompt.

use std::io::Write;

use muser_engine::{Logits, Sampler, SamplingParams, Session};

use crate::common::{CliResult, ModelOpts};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelOpts,
    /// Prompt as token ids, comma-separated.
    #[arg(long = "prompt-ids", value_delimiter = ',')]
    pub prompt_ids: Vec<u32>,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 64)]
    pub n_predict: usize,
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Context size.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx_size: usize,
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
}

pub fn run(a: Args) -> CliResult {
    let params = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        seed: a.seed,
        ..Default::default()
    };
    params.validate()?;
    if a.prompt_ids.is_empty() {
        return Err("an empty prompt: give --prompt-ids".into());
    }
    let loaded = a.model.load()?;
    let kv = a.model.kv()?;
    crate::with_model!(&loaded, model => generate(model, &a, params, kv))
}

fn generate<B: muser_engine::Backend>(
    model: &muser_engine::MuseGlimmer<B>,
    a: &Args,
    params: SamplingParams,
    kv: muser_engine::KvType,
) -> CliResult {
    let n_ctx = a.ctx_size.min(model.config.n_ctx_train);
    let mut s = Session::new(model, kv, n_ctx)?;
    let mut sampler = Sampler::new(params);
    for &t in &a.prompt_ids {
        sampler.accept(t);
    }
    let mut logits = s.feed(&a.prompt_ids, a.ubatch, Logits::Last)?;
    let mut out = std::io::stdout().lock();
    for _ in 0..a.n_predict {
        if s.pos() >= n_ctx {
            eprintln!("\n[context full at {n_ctx} tokens]");
            break;
        }
        let t = sampler.sample(&logits);
        sampler.accept(t);
        write!(out, "{t} ")?;
        out.flush()?;
        logits = s.feed(&[t], 1, Logits::Last)?;
    }
    writeln!(out)?;
    Ok(())
}
