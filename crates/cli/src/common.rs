//! Options and model loading shared by the subcommands.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args as ClapArgs;
use muser_cuda::CudaBackend;
use muser_engine::{CpuBackend, KvType, ModelFile, MuseGlimmer, NumericMode};
use muser_gguf::Gguf;

/// The small random-weight test model compiled into the binary: what runs without `-m`.
pub const BUNDLED_NAME: &str = "tame-q4_k_m";
static BUNDLED: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/models/tame-q4_k_m.gguf"
));

pub type CliResult = Result<(), Box<dyn std::error::Error>>;

/// Where and how the model runs.
#[derive(ClapArgs, Clone, Debug)]
pub struct ModelOpts {
    /// Path to a Muse Glimmer GGUF file (default: the bundled random-weight test model).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Numeric mode: accurate (exact dequantization, f32) or parity (llama.cpp's CPU arithmetic).
    #[arg(long, default_value = "accurate")]
    pub mode: String,
    /// KV cache element type: f32, f16, bf16 or q8_0.
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: String,
    /// CPU threads (0 = all cores).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Where to run: cpu, or cuda / cuda:N for an NVIDIA GPU.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// A loaded model on one of the backends.
pub enum Loaded {
    Cpu(MuseGlimmer<CpuBackend>),
    Cuda(MuseGlimmer<CudaBackend>),
}

/// Run the same code on whichever backend holds the model.
#[macro_export]
macro_rules! with_model {
    ($loaded:expr, $m:ident => $body:expr) => {
        match $loaded {
            $crate::common::Loaded::Cpu($m) => $body,
            $crate::common::Loaded::Cuda($m) => $body,
        }
    };
}

/// `cpu`, `cuda` or `cuda:N`.
pub fn parse_device(s: &str) -> Result<Option<usize>, String> {
    match s {
        "cpu" => Ok(None),
        "cuda" => Ok(Some(0)),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Some)
            .ok_or_else(|| format!("unknown device '{s}' (expected cpu, cuda or cuda:N)")),
    }
}

impl ModelOpts {
    pub fn kv(&self) -> Result<KvType, muser_engine::Error> {
        KvType::parse(&self.kv_type)
    }

    /// A printable name of the model.
    pub fn model_name(&self) -> String {
        self.model
            .as_ref()
            .map_or(format!("(bundled {BUNDLED_NAME})"), |p| {
                p.display().to_string()
            })
    }

    /// Open the GGUF: the file given with `-m`, or the bundled test model (saying so).
    pub fn gguf(&self) -> Result<Arc<Gguf>, Box<dyn std::error::Error>> {
        match &self.model {
            Some(p) => Ok(Arc::new(Gguf::open(p)?)),
            None => {
                eprintln!(
                    "note: no -m given, so this runs the bundled {BUNDLED_NAME} model: a tiny RANDOM-WEIGHT test model \
                     (3 layers, 256 wide) whose output is noise. To run Muse Glimmer, point -m at its GGUF, e.g. \
                     muser generate -m Muse-Glimmer-30B-Q4_K_M.gguf -p \"Hello\""
                );
                Ok(Arc::new(Gguf::from_bytes(BUNDLED.to_vec())?))
            }
        }
    }

    pub fn load(&self) -> Result<Loaded, Box<dyn std::error::Error>> {
        self.load_from(self.gguf()?)
    }

    pub fn load_from(&self, g: Arc<Gguf>) -> Result<Loaded, Box<dyn std::error::Error>> {
        let mode = NumericMode::parse(&self.mode)?;
        let device = parse_device(&self.device)?;
        let file = ModelFile::from_gguf(g)?;
        match device {
            None => Ok(Loaded::Cpu(MuseGlimmer::load(
                &file,
                CpuBackend::new(mode, self.threads)?,
            )?)),
            Some(ordinal) => {
                if mode != NumericMode::Accurate {
                    return Err("the CUDA backend implements the accurate mode only".into());
                }
                CudaBackend::supports(&file.config)?;
                let backend = CudaBackend::new(ordinal)?;
                Ok(Loaded::Cuda(MuseGlimmer::load(&file, backend)?))
            }
        }
    }
}

/// Read raw little-endian int32 token ids.
pub fn read_tokens(path: &std::path::Path) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() % 4 != 0 {
        return Err(format!(
            "{} has {} bytes, not a whole number of int32 token ids",
            path.display(),
            bytes.len()
        )
        .into());
    }
    bytes
        .chunks_exact(4)
        .enumerate()
        .map(|(i, c)| {
            let t = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            u32::try_from(t)
                .map_err(|_| format!("{}: token {i} is negative ({t})", path.display()).into())
        })
        .collect()
}
