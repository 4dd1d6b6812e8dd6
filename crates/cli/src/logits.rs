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
    /// Also write every forward pass's intermediate tensors (llama.cpp's graph names) to this
    /// folder: DIR/NNNNNN.f32 (raw little-endian f32) and DIR/index.tsv (file, call, name,
    /// values), as tests/fixtures/llama_logits.c --dump-tensors does for llama.cpp;
    /// tools/compare_dumps.py finds where two dumps part.
    #[arg(long = "dump-tensors")]
    pub dump_tensors: Option<PathBuf>,
}

/// The tap of `--dump-tensors`: a forward pass begins at `embd_norm`.
fn dump_tap(dir: &std::path::Path) -> Result<muser_engine::muse_glimmer::Tap, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let index = std::fs::File::create(dir.join("index.tsv"))
        .map_err(|e| format!("cannot create {}: {e}", dir.join("index.tsv").display()))?;
    let mut index = std::io::BufWriter::new(index);
    writeln!(index, "file\tcall\tname\tvalues").map_err(|e| e.to_string())?;
    let state = std::sync::Mutex::new((index, 0usize, 0usize)); // (index, call, file number)
    let dir = dir.to_path_buf();
    Ok(Box::new(move |name: &str, v: &[f32]| {
        let Ok(mut st) = state.lock() else { return };
        let (index, call, file) = &mut *st;
        if name == "embd_norm" {
            *call += 1;
        }
        let fname = format!("{:06}.f32", *file);
        *file += 1;
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        // A dump is a debugging aid: a failed write is reported, the run goes on.
        if let Err(e) = std::fs::write(dir.join(&fname), bytes) {
            eprintln!("cannot write {fname}: {e}");
        }
        let _ = writeln!(
            index,
            "{fname}\t{}\t{name}\t{}",
            call.saturating_sub(1),
            v.len()
        );
        let _ = index.flush();
    }))
}

pub fn run(a: Args) -> CliResult {
    let tokens = read_tokens(&a.tokens)?;
    if tokens.is_empty() {
        return Err(format!("{} holds no tokens", a.tokens.display()).into());
    }
    // The cache type first: a bad --kv-type is named before the weights load.
    let kv = a.model.kv()?;
    let mut loaded = a.model.load()?;
    if let crate::common::Loaded::Cpu(m) = &mut loaded {
        // Parity mode sizes llama.cpp's sliding-window cache from its n_ubatch: use ours.
        m.backend.parity_ubatch = a.ubatch;
    }
    let n_ctx = a.ctx_size.unwrap_or(tokens.len());
    if tokens.len() > n_ctx {
        return Err(format!("{} tokens do not fit a context of {n_ctx}", tokens.len()).into());
    }
    if let Some(dir) = &a.dump_tensors {
        let tap = dump_tap(dir)?;
        crate::with_model!(&loaded, model => model.set_tap(tap))?;
    }
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
