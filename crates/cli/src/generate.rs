//! `muser generate`: continue a prompt, streaming text as it is produced.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use muser_engine::speculative::{self, NgramDraft};
use muser_engine::{Backend, Error, KvType, Logits, MuseGlimmer, Sampler, SamplingParams, Session};
use muser_text::{StreamDecoder, Tokenizer};

use crate::common::{CliResult, ModelOpts};

/// Sampling options shared by `generate` and `chat`.
#[derive(clap::Args, Clone, Debug)]
pub struct SampleOpts {
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    pub n_predict: usize,
    /// Temperature (0 = greedy).
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
    /// Context size (at most the model's context_length).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx_size: usize,
    /// Prompt micro-batch size.
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
    /// Speculative decoding from the sequence's own tokens (prompt lookup, llama.cpp's
    /// ngram-simple): where the last N tokens appeared before, guess that what followed them
    /// follows again, and check the guess in the same forward. 0: off.
    #[arg(long = "draft-ngram", default_value_t = 0)]
    pub draft_ngram: usize,
    /// Tokens guessed at most in a step (with --draft-ngram).
    #[arg(long = "draft-max", default_value_t = 16)]
    pub draft_max: usize,
}

impl SampleOpts {
    /// The guesses `--draft-ngram` asks for, if any.
    pub fn draft(&self) -> Result<Option<NgramDraft>, Error> {
        if self.draft_ngram == 0 {
            return Ok(None);
        }
        NgramDraft::new(self.draft_ngram, self.draft_max).map(Some)
    }

    pub fn params(&self) -> Result<SamplingParams, String> {
        let p = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            seed: self.seed,
            ..Default::default()
        };
        p.validate()?;
        Ok(p)
    }
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelOpts,
    /// The prompt text.
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// The prompt as token ids, comma-separated (instead of text).
    #[arg(long = "prompt-ids", value_delimiter = ',')]
    pub prompt_ids: Vec<u32>,
    /// Do not prepend BOS to a text prompt.
    #[arg(long = "no-bos")]
    pub no_bos: bool,
    /// Print token ids instead of text.
    #[arg(long = "print-ids")]
    pub print_ids: bool,
    /// A file for the prompt's state (llama.cpp's `--prompt-cache`): where it exists, the prompt
    /// continues from the tokens it shares with the one saved there; after the prompt runs, its
    /// state is saved there. A file saved from another model, cache type or a larger context is
    /// refused.
    #[arg(long = "prompt-cache")]
    pub prompt_cache: Option<std::path::PathBuf>,
    /// Read the prompt cache, never write it.
    #[arg(long = "prompt-cache-ro", requires = "prompt_cache")]
    pub prompt_cache_ro: bool,
    #[command(flatten)]
    pub sample: SampleOpts,
}

/// Generate up to `n` tokens after `logits`, calling `emit(id)` for each; stops at an
/// end-of-generation token, a full context, or when `stop` is raised (Ctrl-C in chat).
/// `tokens` are the sequence's tokens so far (the prompt): with `draft`, each step guesses the
/// tokens that follow from them (`speculative`) and runs the guess in the same forward; the
/// tokens sampled are plain decoding's (see `muser_engine::speculative`).
#[allow(clippy::too_many_arguments)]
pub fn run_loop<B: Backend>(
    s: &mut Session<'_, B>,
    sampler: &mut Sampler,
    logits: Vec<f32>,
    n: usize,
    eog: &[u32],
    stop: &AtomicBool,
    tokens: &[u32],
    draft: Option<NgramDraft>,
    emit: &mut dyn FnMut(u32) -> Result<(), Box<dyn std::error::Error>>,
) -> Result<Generated, Box<dyn std::error::Error>> {
    let mut g = Generated::default();
    if n == 0 || stop.load(Ordering::SeqCst) {
        return Ok(g);
    }
    // A file whose weights or scales overflow f32 gives NaN (or infinite) logits: sampling
    // would turn them into token 0, over and over, and say nothing.
    if logits.iter().any(|v| !v.is_finite()) {
        return Err(format!(
            "the model's logits are not finite after {} positions: its weights or scales overflow f32 (a damaged file?)",
            s.pos()
        )
        .into());
    }
    let mut t = sampler.sample(&logits);
    sampler.accept(t);
    g.tokens.push(t);
    if eog.contains(&t) {
        return Ok(g);
    }
    emit(t)?;
    let mut history = tokens.to_vec();
    history.push(t);
    while g.tokens.len() < n {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        if s.pos() >= s.n_ctx() {
            eprintln!("\n[context full at {} tokens]", s.n_ctx());
            break;
        }
        let guess = draft.map(|d| d.draft(&history)).unwrap_or_default();
        let st = speculative::step(s, sampler, t, &guess, eog, n - g.tokens.len())?;
        g.steps += 1;
        g.guessed += guess.len();
        g.accepted += st.accepted;
        for &u in &st.tokens {
            g.tokens.push(u);
            if eog.contains(&u) {
                return Ok(g);
            }
            emit(u)?;
            history.push(u);
        }
        t = *st.tokens.last().unwrap_or(&t);
    }
    Ok(g)
}

/// What `run_loop` generated.
#[derive(Debug, Default)]
pub struct Generated {
    /// The tokens sampled (the last may be an end-of-generation token).
    pub tokens: Vec<u32>,
    /// Forwards after the first token, guessed tokens, and guessed tokens kept.
    pub steps: usize,
    pub guessed: usize,
    pub accepted: usize,
}

pub fn run(a: Args) -> CliResult {
    let params = a.sample.params()?;
    // A bad --draft-ngram is named before the weights load.
    a.sample.draft()?;
    let g = a.model.gguf()?;
    let tok = Tokenizer::from_gguf(&g)?;
    let prompt: Vec<u32> = match (&a.prompt, a.prompt_ids.is_empty()) {
        (Some(_), false) => return Err("give either -p or --prompt-ids, not both".into()),
        (Some(p), true) => tok.encode(p, tok.add_bos_default() && !a.no_bos, false)?,
        (None, false) => a.prompt_ids.clone(),
        (None, true) => return Err("an empty prompt: give -p TEXT (or --prompt-ids)".into()),
    };
    if prompt.is_empty() {
        return Err("the prompt encodes to no tokens".into());
    }
    // The cache type first: a bad --kv-type is named before the weights load.
    let kv = a.model.kv()?;
    let loaded = a.model.load_from(g)?;
    crate::with_model!(&loaded, model => generate(model, &a, &tok, &prompt, params, kv))
}

fn generate<B: Backend>(
    model: &MuseGlimmer<B>,
    a: &Args,
    tok: &Tokenizer,
    prompt: &[u32],
    params: SamplingParams,
    kv: KvType,
) -> CliResult {
    let n_ctx = a.sample.ctx_size.min(model.config.n_ctx_train);
    if n_ctx < 2 {
        return Err(Error::Input(format!(
            "--ctx-size {n_ctx} leaves no room: a prompt token and a generated one need at least 2"
        ))
        .into());
    }
    if prompt.len() >= n_ctx {
        return Err(Error::Input(format!(
            "the prompt has {} tokens, which exceed the context size {n_ctx} (at most {} fit with room to generate)",
            prompt.len(),
            n_ctx - 1
        ))
        .into());
    }
    let mut s = Session::new(model, kv, n_ctx)?;
    let mut sampler = Sampler::new(params);
    prompt.iter().for_each(|&t| sampler.accept(t));
    let start = match &a.prompt_cache {
        Some(p) if p.exists() => from_prompt_cache(&mut s, p, prompt)?,
        _ => 0,
    };
    let logits = s.feed(&prompt[start..], a.sample.ubatch, Logits::Last)?;
    if let (Some(p), false) = (&a.prompt_cache, a.prompt_cache_ro) {
        let n = s.save_state(p, prompt)?;
        eprintln!(
            "[prompt cache: {} positions saved to {} ({n} bytes)]",
            prompt.len(),
            p.display()
        );
    }
    let mut dec = StreamDecoder::new(true, Vec::<String>::new());
    let mut out = std::io::stdout().lock();
    let never = AtomicBool::new(false);
    let eog = tok.eog_ids();
    let draft = a.sample.draft()?;
    let t0 = std::time::Instant::now();
    let g = run_loop(
        &mut s,
        &mut sampler,
        logits,
        a.sample.n_predict,
        &eog,
        &never,
        prompt,
        draft,
        &mut |t| {
            if a.print_ids {
                write!(out, "{t} ")?;
            } else {
                write!(out, "{}", dec.push(tok, t)?)?;
            }
            out.flush()?;
            Ok(())
        },
    )?;
    if !a.print_ids {
        write!(out, "{}", dec.finish())?;
    }
    writeln!(out)?;
    let secs = t0.elapsed().as_secs_f64();
    let rate = format!(
        "{} tokens in {secs:.2} s ({:.1}/s)",
        g.tokens.len(),
        g.tokens.len() as f64 / secs.max(1e-9)
    );
    match draft {
        Some(d) => eprintln!(
            "[{rate}; guesses of {} after {} matched: {} of {} guessed tokens kept over {} steps]",
            d.max, d.n, g.accepted, g.guessed, g.steps
        ),
        None => eprintln!("[{rate}]"),
    }
    Ok(())
}

/// Load `path` into `s` and go back to the longest prefix it shares with `prompt` (the last
/// prompt token always runs: its logits are the first draw's), where the cache can; returns the
/// prompt tokens the cache holds. A file that does not fit is an error, not a silent restart.
fn from_prompt_cache<B: Backend>(
    s: &mut Session<'_, B>,
    path: &std::path::Path,
    prompt: &[u32],
) -> Result<usize, Box<dyn std::error::Error>> {
    let (saved, made_by) = s.load_state(path)?;
    let common = saved
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count()
        .min(prompt.len() - 1);
    let start = if common > 0 && s.truncate(common) {
        common
    } else {
        s.reset();
        0
    };
    eprintln!(
        "[prompt cache: {start} of {} prompt tokens from {} (saved {} positions, computed by {made_by})]",
        prompt.len(),
        path.display(),
        saved.len()
    );
    Ok(start)
}
