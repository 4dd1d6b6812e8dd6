//! Options and model loading shared by the subcommands.

use std::path::PathBuf;

use clap::Args as ClapArgs;
use muser_engine::{CpuBackend, KvType, ModelFile, MuseGlimmer, NumericMode};

pub type CliResult = Result<(), Box<dyn std::error::Error>>;

/// Where and how the model runs.
#[derive(ClapArgs, Clone, Debug)]
pub struct ModelOpts {
    /// Path to a Muse Glimmer GGUF file.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Numeric mode: accurate (exact dequantization, f32) or parity (llama.cpp's CPU arithmetic).
    #[arg(long, default_value = "accurate")]
    pub mode: String,
    /// KV cache element type: f32, f16, bf16 or q8_0.
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: String,
    /// CPU threads (0 = all cores).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
}

impl ModelOpts {
    pub fn kv(&self) -> Result<KvType, muser_engine::Error> {
        KvType::parse(&self.kv_type)
    }

    pub fn load(&self) -> Result<MuseGlimmer<CpuBackend>, Box<dyn std::error::Error>> {
        let mode = NumericMode::parse(&self.mode)?;
        let file = ModelFile::open(&self.model)?;
        let backend = CpuBackend::new(mode, self.threads)?;
        Ok(MuseGlimmer::load(&file, backend)?)
    }
}

/// Read raw little-endian int32 token ids.
pub fn read_tokens(path: &std::path::Path) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() % 4 != 0 {
        return Err(format!("{} has {} bytes, not a whole number of int32 token ids", path.display(), bytes.len()).into());
    }
    bytes
        .chunks_exact(4)
        .enumerate()
        .map(|(i, c)| {
            let t = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            u32::try_from(t).map_err(|_| format!("{}: token {i} is negative ({t})", path.display()).into())
        })
        .collect()
}
