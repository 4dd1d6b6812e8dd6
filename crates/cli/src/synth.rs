//! `muser synth OUT.gguf --preset 30b --layout q4_k_m`.

use std::path::PathBuf;
use std::time::Instant;

use muser_engine::synth::{self, Layout};

use crate::common::CliResult;

#[derive(clap::Args)]
pub struct Args {
    /// Output path.
    pub out: PathBuf,
    /// Shapes: 30b (the released model), mid (8 layers, 2048 wide), small.
    #[arg(long, default_value = "30b")]
    pub preset: String,
    /// q4_k_m (llama.cpp's mix) or one format for every matrix (f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k).
    #[arg(long, default_value = "q4_k_m")]
    pub layout: String,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Overwrite the output if it exists (without it an existing file, maybe a real model, is
    /// left alone).
    #[arg(long)]
    pub force: bool,
}

pub fn run(a: Args) -> CliResult {
    if a.out.exists() && !a.force {
        return Err(format!(
            "{} exists; muser synth writes random weights and would replace it (--force overwrites it)",
            a.out.display()
        )
        .into());
    }
    let p = synth::preset(&a.preset)?;
    let layout = Layout::parse(&a.layout)?;
    let t = Instant::now();
    synth::write(&a.out, p, layout, a.seed)?;
    let size = std::fs::metadata(&a.out)?.len();
    eprintln!(
        "wrote {} ({:.2} GB, preset {}, layout {}) in {:.1} s: RANDOM WEIGHTS, for speed tests only",
        a.out.display(),
        size as f64 / 1e9,
        p.name,
        a.layout,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
