//! Options and model loading shared by the subcommands.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args as ClapArgs;
use muser_cuda::CudaBackend;
use muser_engine::tp::{ShardPlan, TpBackend};
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
    /// Numeric mode: accurate (exact dequantization, f32), parity (llama.cpp's CPU arithmetic),
    /// cuda-parity (accurate, with llama.cpp's CUDA one-token products: q8_1 activations, f16
    /// sums for F16 weights; CPU or one GPU), or fast (CUDA only: products of more than 64
    /// tokens with weights and activations rounded to f16, f32 sums; Q4_K/Q6_K products of up to
    /// 64 tokens with activations to within 2^-14 of their block's largest value (two digit
    /// planes)).
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
    /// Split every layer over N ranks (GPUs N..N+k with `--device cuda:N`; simulated CPU ranks
    /// with `--device cpu`). Partial sums are all-reduced through NCCL on CUDA, through the
    /// host on the CPU.
    #[arg(long = "tensor-parallel", default_value_t = 1)]
    pub tensor_parallel: usize,
    /// CUDA: a sequence's tokens are bit for bit the same whatever else shares its batches
    /// (costs single-sequence decode speed: one token also runs on the tensor-core kernels).
    #[arg(long = "batch-invariant")]
    pub batch_invariant: bool,
    /// CUDA: keep an f16 copy of each matrix that multiplies many tokens at once (`--mode fast`:
    /// more than 48, one f16 value a weight, 2 bytes, 60 GB for the 30B; the accurate mode: its
    /// prompt products' split form, hi and lo, 4 bytes a weight, 120 GB for the 30B), so prompts
    /// and large batches read f16 weights instead of dequantizing them every time. Copies stop
    /// where a tenth of the device, at least 4 GB, would no longer stay free: the matrices met
    /// first keep them, the others are dequantized as without the flag (the same values).
    #[arg(long = "f16-weights")]
    pub f16_weights: bool,
    /// CUDA, `--mode fast`, compute capability 8.9 or newer: keep an e4m3 (FP8) copy of each
    /// matrix that multiplies more than 32 tokens at once (1 byte per weight more device memory,
    /// 30 GB for the 30B) and run those products on the FP8 tensor cores: weights and
    /// activations rounded to e4m3 (to 2^-4 of each value), f32 sums. Coarser than
    /// --f16-weights, about twice its speed on prompts.
    #[arg(long = "fp8-weights")]
    pub fp8_weights: bool,
}

/// A loaded model on one of the backends.
pub enum Loaded {
    Cpu(MuseGlimmer<CpuBackend>),
    Cuda(MuseGlimmer<CudaBackend>),
    TpCpu(MuseGlimmer<TpBackend<CpuBackend>>),
    TpCuda(MuseGlimmer<TpBackend<CudaBackend>>),
}

/// Run the same code on whichever backend holds the model.
#[macro_export]
macro_rules! with_model {
    ($loaded:expr, $m:ident => $body:expr) => {
        match $loaded {
            $crate::common::Loaded::Cpu($m) => $body,
            $crate::common::Loaded::Cuda($m) => $body,
            $crate::common::Loaded::TpCpu($m) => $body,
            $crate::common::Loaded::TpCuda($m) => $body,
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
        let device = parse_device(&self.device)?;
        // `fast` is accurate everywhere but in the CUDA products of several tokens (two-plane
        // int8 tensor-core kernels; TF32 for the formats without them).
        let fast = self.mode == "fast";
        if self.f16_weights && device.is_none() {
            return Err("--f16-weights keeps f16 copies on CUDA (with --device cuda)".into());
        }
        if self.f16_weights && (self.mode == "cuda-parity" || self.batch_invariant) {
            return Err("--f16-weights keeps copies for the f16 tensor-core products, which --mode cuda-parity and --batch-invariant never run".into());
        }
        if self.fp8_weights && !(fast && device.is_some()) {
            return Err("--fp8-weights keeps e4m3 copies for --mode fast on CUDA (with --device cuda --mode fast)".into());
        }
        if fast && device.is_none() {
            return Err("--mode fast is a CUDA mode (coarser activations in products of several tokens); the CPU has accurate, parity and cuda-parity".into());
        }
        let mode = if fast {
            NumericMode::Accurate
        } else {
            NumericMode::parse(&self.mode)
                .map_err(|e| format!("{e} (or fast, with --device cuda)"))?
        };
        let file = ModelFile::from_gguf(g)?;
        // A progress bar while the layers load (drawn on a terminal only; GPU uploads take seconds).
        let bar = indicatif::ProgressBar::new(file.config.n_layer as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} layers")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(self.model_name());
        let mut progress = |done: usize, _total: usize| bar.set_position(done as u64);
        let world = self.tensor_parallel;
        if world == 0 {
            return Err("--tensor-parallel needs at least 1 rank".into());
        }
        let loaded = match device {
            None if world > 1 => {
                let plan = ShardPlan::new(&file.config, &file.tensors, world)?;
                // -t 0 (all cores) shares the machine's cores among the ranks.
                let cores = match self.threads {
                    0 => std::thread::available_parallelism().map_or(1, usize::from),
                    t => t,
                };
                let threads = (cores / world).max(1);
                let ranks = (0..world)
                    .map(|_| CpuBackend::new(mode, threads))
                    .collect::<Result<Vec<_>, _>>()?;
                Loaded::TpCpu(MuseGlimmer::load_with_progress(
                    &file,
                    TpBackend::new(ranks, plan)?,
                    &mut progress,
                )?)
            }
            Some(ordinal) if world > 1 => {
                if mode != NumericMode::Accurate {
                    return Err(
                        "tensor parallelism on CUDA implements the accurate and fast modes".into(),
                    );
                }
                CudaBackend::supports(&file.config)?;
                let plan = ShardPlan::new(&file.config, &file.tensors, world)?;
                if ordinal.checked_add(world).is_none() {
                    return Err(format!(
                        "--device cuda:{ordinal} with --tensor-parallel {world}: no such GPUs"
                    )
                    .into());
                }
                let ranks = (0..world)
                    .map(|i| CudaBackend::new(ordinal + i))
                    .collect::<Result<Vec<_>, _>>()?;
                for r in &ranks {
                    r.set_fast_mode(fast)?;
                    if self.f16_weights {
                        r.set_f16_weights(true);
                    }
                    if self.fp8_weights {
                        r.set_fp8_weights(true)?;
                    }
                    r.set_batch_invariant(self.batch_invariant);
                }
                let nccl = Box::new(muser_cuda::nccl::NcclAllReduce::new(&ranks)?);
                let tp = TpBackend::new(ranks, plan)?.with_all_reduce(nccl);
                Loaded::TpCuda(MuseGlimmer::load_with_progress(&file, tp, &mut progress)?)
            }
            None => {
                if self.batch_invariant && mode != NumericMode::Accurate {
                    return Err("--batch-invariant: the CPU is batch-invariant in accurate mode only (parity follows llama.cpp's row-count-dependent products)".into());
                }
                let backend = CpuBackend::new(mode, self.threads)?;
                Loaded::Cpu(MuseGlimmer::load_with_progress(
                    &file,
                    backend,
                    &mut progress,
                )?)
            }
            Some(ordinal) => {
                if !matches!(mode, NumericMode::Accurate | NumericMode::CudaParity) {
                    return Err(
                        "the CUDA backend implements the accurate, fast and cuda-parity modes"
                            .into(),
                    );
                }
                CudaBackend::supports(&file.config)?;
                let backend = CudaBackend::new(ordinal)?;
                backend.set_fast_mode(fast)?;
                if self.f16_weights {
                    backend.set_f16_weights(true);
                }
                if self.fp8_weights {
                    backend.set_fp8_weights(true)?;
                }
                backend.set_cuda_parity(mode == NumericMode::CudaParity);
                backend.set_batch_invariant(self.batch_invariant);
                Loaded::Cuda(MuseGlimmer::load_with_progress(
                    &file,
                    backend,
                    &mut progress,
                )?)
            }
        };
        bar.finish_and_clear();
        Ok(loaded)
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
