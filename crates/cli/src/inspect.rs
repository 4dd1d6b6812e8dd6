//! `muser inspect F.gguf`.

use std::path::PathBuf;

use muser_engine::{LayerKind, ModelFile};
use muser_gguf::Gguf;

use crate::common::CliResult;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file.
    pub file: PathBuf,
    /// Print every tensor (default: the first layer's and the global ones).
    #[arg(long)]
    pub all_tensors: bool,
}

pub fn run(a: Args) -> CliResult {
    let g = Gguf::open(&a.file)?;
    println!(
        "file: {} ({} bytes, GGUF v{}, alignment {})",
        a.file.display(),
        g.file_size(),
        g.version,
        g.alignment
    );
    if g.n_shards() > 1 {
        println!(
            "split model: {} shards, opened from the first (the bytes are all of theirs)",
            g.n_shards()
        );
    }
    println!("\nmetadata ({} keys):", g.metadata().len());
    for (k, v) in g.metadata() {
        println!(
            "  {:<48} {:<7} {}",
            shown(k),
            v.value_type().name(),
            v.summary(8)
        );
    }
    println!("\ntensors ({}):", g.tensors().len());
    let mut bytes_by_type: std::collections::BTreeMap<&str, u64> = Default::default();
    for t in g.tensors() {
        *bytes_by_type.entry(t.ggml_type.name()).or_default() += t.n_bytes;
        if a.all_tensors || !t.name.starts_with("blk.") || t.name.starts_with("blk.0.") {
            println!(
                "  {:<36} {:<6} {:?}",
                shown(&t.name),
                t.ggml_type.name(),
                t.dims
            );
        }
    }
    if !a.all_tensors {
        println!("  ... (--all-tensors lists every layer)");
    }
    for (ty, b) in &bytes_by_type {
        println!("  {ty:<6} {:>10.1} MiB", *b as f64 / (1 << 20) as f64);
    }
    println!();
    match ModelFile::from_gguf(std::sync::Arc::new(g)) {
        Ok(f) => {
            let c = &f.config;
            println!("Muse Glimmer configuration (validated):");
            println!(
                "  n_vocab {}  n_embd {}  n_ff {}  n_layer {}",
                c.n_vocab, c.n_embd, c.n_ff, c.n_layer
            );
            println!(
                "  n_head {}  n_head_kv {}  head_dim {}  n_ctx_train {}",
                c.n_head, c.n_head_kv, c.head_dim, c.n_ctx_train
            );
            println!(
                "  rms_eps {:e} (GGUF)  post_norm_eps {:e} (llama.cpp constant)",
                c.rms_eps,
                muser_engine::POST_NORM_EPS
            );
            println!(
                "  rope base {} (sliding layers: {})  sliding window {}",
                c.rope_freq_base, c.rope_freq_base_swa, c.n_swa
            );
            println!(
                "  logit_scale {}  softcap {}",
                c.logit_scale,
                c.softcap.map_or("none (0)".to_string(), |v| v.to_string())
            );
            let kinds: String = c
                .layer_kinds
                .iter()
                .map(|k| if *k == LayerKind::FullNope { 'F' } else { 's' })
                .collect();
            let full: Vec<usize> = (0..c.n_layer)
                .filter(|&i| c.layer_kinds[i] == LayerKind::FullNope)
                .collect();
            println!("  layer kinds (s = sliding+RoPE, F = full+NoPE): {kinds}");
            println!(
                "  full layers: {full:?}{}",
                if c.has_reference_pattern() {
                    " (the reference partition)"
                } else {
                    " (NOT the reference partition)"
                }
            );
            println!("probes:");
            println!(
                "  attn_q_norm: constant {} on every layer (qk_scale_factor)",
                f.probes.qk_scale
            );
            println!(
                "  attn_k_norm: all ones on every layer: {}",
                f.probes.k_norm_ones
            );
            // The text side: generate needs the tokenizer, chat and serve's chat route the
            // template too (or --chat-template-file).
            let tokenizer = muser_text::Tokenizer::from_gguf(&f.gguf);
            match &tokenizer {
                Ok(t) => println!("tokenizer: {} tokens, readable", t.vocab().tokens.len()),
                Err(e) => println!("tokenizer: refused: {e}"),
            }
            match muser_text::ChatTemplate::from_gguf(&f.gguf) {
                Ok(_) => println!("chat template: compiles"),
                Err(e) => println!("chat template: {e}"),
            }
            match tokenizer {
                Ok(_) => println!("verdict: Muser can run this file"),
                Err(e) => {
                    println!("verdict: Muser refuses this file: its tokenizer: {e}");
                    return Err(e.into());
                }
            }
        }
        Err(e) => {
            println!("verdict: Muser refuses this file: {e}");
            return Err(e.into());
        }
    }
    Ok(())
}

/// A name from the file as printed: escaped where it holds control characters, so a hostile
/// key cannot write terminal escape sequences.
fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    if s.chars().any(char::is_control) {
        std::borrow::Cow::Owned(s.escape_debug().to_string())
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}
