//! `muser logits`: the interface every parity check uses. Reads raw little-endian int32
//! token ids and writes raw little-endian f32 logits, row-major [n_tokens][n_vocab], one row
//! per position (teacher-forced).

use std::io::Write;
use std::path::PathBuf;

use muser_engine::{Logits, Session};

use crate::common::{CliResult, ModelOpts, read_tokens};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelOpts,
    /// Token ids, raw little-endian int32.
    #[arg(long)]
    pub tokens: PathBuf,
    /// Output logits, raw little-endian f32 [n_tokens][n_vocab].
    #[arg(long)]
    pub out: PathBuf,
    /// Micro-batch size (tokens per forward pass).
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
    /// Context size (default: the number of tokens).
    #[arg(long = "ctx-size")]
    pub ctx_size: Option<usize>,
}

pub fn run(a: Args) -> CliResult {
    let tokens = read_tokens(&a.tokens)?;
    if tokens.is_empty() {
        return Err(format!("{} holds no tokens", a.tokens.display()).into());
    }
    let mut loaded = a.model.load()?;
    if let crate::common::Loaded::Cpu(m) = &mut loaded {
        // Parity mode sizes llama.cpp's sliding-window cache from its n_ubatch: use ours.
        m.backend.parity_ubatch = a.ubatch;
    }
    let n_ctx = a.ctx_size.unwrap_or(tokens.len());
    if tokens.len() > n_ctx {
        return Err(format!("{} tokens do not fit a context of {n_ctx}", tokens.len()).into());
    }
    let kv = a.model.kv()?;
    let (logits, n_vocab) = crate::with_model!(&loaded, model => {
        let mut s = Session::new(model, kv, n_ctx)?;
        (s.feed(&tokens, a.ubatch, Logits::All)?, model.config.n_vocab)
    });
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(&a.out)
            .map_err(|e| format!("cannot create {}: {e}", a.out.display()))?,
    );
    for v in &logits {
        f.write_all(&v.to_le_bytes())?;
    }
    f.flush()?;
    eprintln!(
        "wrote {} x {n_vocab} logits to {}",
        tokens.len(),
        a.out.display()
    );
    Ok(())
}
