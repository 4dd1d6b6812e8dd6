//! `muser serve`: the OpenAI-compatible HTTP server (crates/server).

use std::path::PathBuf;
use std::time::Duration;

use muser_server::{EngineConfig, ServeConfig, TextModel};
use muser_text::{ChatTemplate, Tokenizer};

use crate::common::{BUNDLED_NAME, CliResult, ModelOpts};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelOpts,
    /// Address to listen on (loopback by default: expose it deliberately).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Context of each sequence, prompt and completion (default: 4096, at most the model's).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Sequences decoded together (each holds a KV cache of --ctx-size).
    #[arg(long, default_value_t = 8)]
    pub parallel: usize,
    /// Use this Jinja chat template instead of the GGUF's.
    #[arg(long = "chat-template-file")]
    pub chat_template_file: Option<PathBuf>,
    /// Require 'Authorization: Bearer K' on every endpoint but /health.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Tokens one engine step runs at most: every decoding sequence's token, then prompt chunks.
    #[arg(long, default_value_t = 256)]
    pub ubatch: usize,
    /// Requests (sequences) that may wait for a slot; beyond that the server answers 429.
    #[arg(long = "max-queue", default_value_t = 256)]
    pub max_queue: usize,
    /// KV memory admitted sequences may reserve, counted at their worst case, together with
    /// the caches kept for prefix reuse (default: --parallel full contexts).
    #[arg(long = "kv-budget-mib")]
    pub kv_budget_mib: Option<usize>,
    /// Clear each finished sequence's cache instead of keeping it for a later prompt that
    /// begins with the same tokens (prefix reuse, on by default).
    #[arg(long = "no-prefix-reuse")]
    pub no_prefix_reuse: bool,
    /// Largest request body accepted.
    #[arg(long = "max-body-mib", default_value_t = 8)]
    pub max_body_mib: usize,
    /// The model name clients send (default: the GGUF's file name without .gguf).
    #[arg(long)]
    pub alias: Option<String>,
    /// Seconds in-flight requests get to finish on SIGTERM before they are cancelled.
    #[arg(long = "shutdown-timeout", default_value_t = 30)]
    pub shutdown_timeout: u64,
    /// Seconds a stream may go without its client taking anything it was sent before its
    /// sequence is cancelled and its slot given to the next request.
    #[arg(long = "stall-timeout", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub stall_timeout: u64,
    /// A folder for slot files: `POST /slots/{id}?action=save|restore` with `{"filename": F}`
    /// saves a slot's kept cache there or makes a slot keep one saved there (a conversation's
    /// state across restarts), as llama-server's `--slot-save-path`.
    #[arg(long = "slot-save-path")]
    pub slot_save_path: Option<PathBuf>,
    /// Speculative decoding from each sequence's own tokens (prompt lookup): where its last N
    /// tokens appeared before, guess that what followed them follows again, and check the guess
    /// in the step's forward. For sequences without a grammar or logprobs. 0: off.
    #[arg(long = "draft-ngram", default_value_t = 0)]
    pub draft_ngram: usize,
    /// Tokens guessed at most in a step (with --draft-ngram); the step's --ubatch bounds them too.
    #[arg(long = "draft-max", default_value_t = 8)]
    pub draft_max: usize,
}

pub fn run(a: Args) -> CliResult {
    muser_server::init_logging();
    let mib = |flag: &str, v: usize| -> Result<usize, String> {
        match v.checked_mul(1 << 20) {
            Some(b) if b > 0 => Ok(b),
            _ => Err(format!(
                "{flag} {v}: expected 1 or more MiB that fit in memory"
            )),
        }
    };
    let max_body_bytes = mib("--max-body-mib", a.max_body_mib)?;
    let draft = match a.draft_ngram {
        0 => None,
        n => Some(muser_engine::speculative::NgramDraft::new(n, a.draft_max)?),
    };
    let kv_budget_bytes = a
        .kv_budget_mib
        .map(|m| mib("--kv-budget-mib", m))
        .transpose()?;
    let g = a.model.gguf()?;
    let mut tokenizer = Tokenizer::from_gguf(&g)?;
    // Bodies are bounded by --max-body-mib; a prompt cannot be longer than one.
    tokenizer.set_max_input_bytes(max_body_bytes);
    let template = match &a.chat_template_file {
        Some(p) => {
            let mut t = ChatTemplate::from_file(p)?;
            t.set_special_tokens(&tokenizer);
            Some(t)
        }
        None => match ChatTemplate::from_gguf(&g) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("warning: {e}; chat requests will be refused with 400");
                None
            }
        },
    };
    let model_id = a.alias.clone().unwrap_or_else(|| match &a.model.model {
        Some(p) => p
            .file_name()
            .map(|f| f.to_string_lossy().trim_end_matches(".gguf").to_string())
            .unwrap_or_else(|| p.display().to_string()),
        None => BUNDLED_NAME.to_string(),
    });
    let kv_type = a.model.kv()?;
    let loaded = a.model.load_from(g)?;
    let n_ctx_train = crate::with_model!(&loaded, m => m.config.n_ctx_train);
    let n_ctx = a.ctx_size.unwrap_or(4096.min(n_ctx_train));
    let cfg = ServeConfig {
        model_id,
        engine: EngineConfig {
            n_ctx,
            parallel: a.parallel,
            step_tokens: a.ubatch,
            max_queue: a.max_queue,
            kv_type,
            kv_budget_bytes,
            prefix_reuse: !a.no_prefix_reuse,
            stall_timeout: Duration::from_secs(a.stall_timeout),
            draft,
        },
        api_key: a.api_key.clone().filter(|k| !k.is_empty()),
        max_body_bytes,
        shutdown_grace: Duration::from_secs(a.shutdown_timeout),
        slot_save_path: a.slot_save_path.clone(),
    };
    let text = TextModel {
        tokenizer,
        template,
    };
    let addr = format!("{}:{}", a.host, a.port);
    crate::with_model!(loaded, m => muser_server::run(m, text, cfg, &addr))?;
    Ok(())
}
