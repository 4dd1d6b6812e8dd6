//! Muser's CUDA backend: the operations of `muser_engine::Backend` as NVRTC-compiled kernels
//! (kernels/*.cu, one op family per file), weights resident on the device, a device KV cache
//! shaped like the model, and a CUDA graph that replays a whole decode step in one launch.
//!
//! Arithmetic is the CPU backend's accurate mode: exact dequantization, f32 activations and
//! products, f64 norms and elementwise functions; the matrix products sum in another order
//! than the CPU (a few f32 ulp apart).

mod fp8;
pub mod graph;
pub mod kernels;
pub mod matrix;
pub mod nccl;
mod staging;
mod words;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr,
    DevicePtrMut, LaunchConfig, PushKernelArg,
};
use muser_engine::backend::{AttnSpec, Backend, Batch, QkSpec, StepRecord, check_logprob_rows};
use muser_engine::cpu::cuda_anchor;
use muser_engine::loader::Matrix;
use muser_engine::sampling::{Cut, LogitEdit, RowDraw, RowLogprob};
use muser_engine::{Error, KvType, MuseConfig, Result};
use muser_gguf::{GgmlType, Gguf};

fn dev<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> Error + '_ {
    move |e| Error::Backend(format!("CUDA {what}: {e:?}"))
}

/// `rows` pair with `n` of `what` (draws, targets) and lie inside `logits`.
fn check_rows(logits: &CudaAct, rows: &[usize], n: usize, what: &str) -> Result<()> {
    if rows.len() != n {
        return Err(Error::Backend(format!(
            "{} rows and {n} {what}",
            rows.len()
        )));
    }
    if let Some(&r) = rows.iter().find(|&&r| r >= logits.rows) {
        return Err(Error::Backend(format!(
            "row {r} is outside the logits ({} rows)",
            logits.rows
        )));
    }
    Ok(())
}

/// Check that the CUDA driver, NVRTC and cuBLAS libraries can be loaded (cudarc panics when
/// a library is missing, so this runs first and turns absence into a clear error).
pub fn check_libraries() -> Result<()> {
    // SAFETY: these only try to dlopen the libraries by name.
    let (drv, rtc, blas) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        )
    };
    let mut missing = Vec::new();
    if !drv {
        missing.push("the CUDA driver (libcuda.so.1)");
    }
    if !rtc {
        missing.push("NVRTC (libnvrtc.so)");
    }
    if !blas {
        missing.push("cuBLAS (libcublas.so)");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::Backend(format!(
            "CUDA is not usable here: cannot load {} (install the NVIDIA driver and CUDA 13 runtime libraries, or add their folder to LD_LIBRARY_PATH; never the stubs folder)",
            missing.join(", ")
        )))
    }
}

/// A weight matrix on the device.
pub struct CudaMatrix {
    pub ty: GgmlType,
    fmt: i32,
    pub rows: usize,
    pub cols: usize,
    nbt: i64,
    data: CudaSlice<u8>,
    /// The largest |w| (f32 bits), for the f16 prompt products' scale (kernels/dequant.cu
    /// `w16_max`, computed once at upload).
    wmax: CudaSlice<u32>,
    /// Its f16 products' factors (kernels/dequant.cu `w16_alpha`): 2^-A, 2^-(A+11), then
    /// cuBLAS's betas 0 and 1.
    alpha16: CudaSlice<f32>,
    /// `--f16-weights`: the matrix in f16 (`gemm16`'s hi, its scale 2^A), made at its first
    /// product in `--mode fast` on the f16 tensor cores and kept.
    w16: std::sync::OnceLock<CudaSlice<u16>>,
    /// `--f16-weights` in the accurate mode: the matrix's rows as the split form's slabs hold
    /// them, [hi | lo] (2 cols halfs a row), made at its first split product and kept.
    w16_split: std::sync::OnceLock<CudaSlice<u16>>,
    /// `--fp8-weights`: the matrix in e4m3, each row times its power of two 2^S_r, and the
    /// rows' 2^-S_r (kernels/dequant.cu `w8_rowscale`, `w8_rows`), made at its first product
    /// in `--mode fast` on the FP8 tensor cores and kept.
    w8: std::sync::OnceLock<(CudaSlice<u8>, CudaSlice<f32>)>,
    /// `--fp8-weights`: this matrix and the ones that share its input (the attention's Q, gate,
    /// K and V; the FFN's gate and up) in one e4m3 copy, their products one FP8 GEMM
    /// (fp8.rs `joint8`). Kept on the group's first matrix.
    w8_joint: std::sync::OnceLock<fp8::Joint8>,
}

/// Activations on the device: `rows` of `cols` f32, room for `cap` rows, and the sums of 8
/// consecutive values the quantized matrix-vector kernels read (`xs`, valid when `xs_ok`).
pub struct CudaAct {
    pub rows: usize,
    pub cols: usize,
    cap: usize,
    data: CudaSlice<f32>,
    xs: CudaSlice<f32>,
    xs_ok: bool,
}

impl CudaAct {
    /// The device buffer (tests upload inputs through it); marks the sums stale.
    pub fn data_mut(&mut self) -> &mut CudaSlice<f32> {
        self.xs_ok = false;
        &mut self.data
    }
}

struct LayerKv {
    k: CudaSlice<u8>,
    v: CudaSlice<u8>,
    /// Ring slots of a sliding layer (0 for a full layer's plane).
    ring: usize,
}

/// One sequence's KV cache on the device: rings of `n_swa + max_ubatch` slots on sliding
/// layers (a whole micro-batch is stored before it is read), planes of `n_ctx` on full layers.
pub struct CudaKv {
    /// Unique per cache: a captured graph was recorded for one cache's KV type.
    pub(crate) id: u64,
    ty: KvType,
    n_ctx: usize,
    /// The model's sliding window (what a ring must keep to go back: `kv_can_truncate`).
    n_swa: usize,
    len: usize,
    /// The most positions stored since the cache was cleared (above `len` after going back).
    high: usize,
    row_bytes: usize,
    layers: Vec<LayerKv>,
    /// Per layer {K base, V base, ring slots} (kernels/common.cuh kv_layer): the kernels find a
    /// token's cache through its address, so one launch serves many sequences.
    #[allow(dead_code)] // owns the allocation `table_addr` points into
    table: CudaSlice<u64>,
    /// The device address of `table`.
    pub(crate) table_addr: u64,
}

impl CudaKv {
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| l.k.len() + l.v.len()).sum()
    }
}

struct Scratch {
    tokens: CudaSlice<u32>,
    pos: CudaSlice<u32>,
    /// Per token of the micro-batch, its cache's table address (CudaKv::table).
    seqtab: CudaSlice<u64>,
    /// What `seqtab` holds now (uploaded again only when it changes).
    seqtab_host: Vec<u64>,
    rows: CudaSlice<u32>,
    cap: usize,
    part: CudaSlice<f32>,
    xs: CudaSlice<f32>,
    deq: CudaSlice<f32>,
    /// The tensor-core kernels' activation planes, run scales and run sums (kernels/mmq.cu),
    /// and their column-range partial sums.
    xq: CudaSlice<u8>,
    xq_sc: CudaSlice<f32>,
    xq_sum: CudaSlice<f32>,
    mpart: CudaSlice<f32>,
    /// The staged tensor-core kernels' counters per (row block, grid layer) of a split launch
    /// (zero between launches: the block that adds the ranges resets its own).
    mcnt: CudaSlice<u32>,
    /// Whose planes `xq` holds inside one `matmul_group` (x's device address, tokens, columns,
    /// planes, padded tokens): the group's later products read the same x and skip xq_planes.
    /// None outside a group.
    xq_made: Option<(u64, usize, usize, usize, usize)>,
    /// The column-split one-token kernels' partial rows, and their per-row-range counters
    /// (zero between launches: the last block of a range resets its own).
    vpart: CudaSlice<f32>,
    vcnt: CudaSlice<u32>,
    /// Greedy selection's per-chunk best values and indices, and its per-row counters.
    amax_v: CudaSlice<f32>,
    amax_i: CudaSlice<i32>,
    amax_cnt: CudaSlice<u32>,
    /// `--mode cuda-parity`'s q8_1 activations: quanta, and per block of 32 the scale and sum.
    pq_q: CudaSlice<u8>,
    pq_d: CudaSlice<f32>,
    pq_s: CudaSlice<f32>,
    /// The f16 prompt products (`gemm16`): the weight slab, the activations and each token's
    /// largest |x|.
    w16: CudaSlice<u16>,
    x16: CudaSlice<u16>,
    x16max: CudaSlice<u32>,
    /// `qmma`'s run sums of the f16 activations (kernels/qmma.cu x16_runsums).
    xrun: CudaSlice<u32>,
    /// `--fp8-weights`: the activations in e4m3 and each token's 2^-S_t (fp8.rs x8_rowquant).
    x8: CudaSlice<u8>,
    x8down: CudaSlice<f32>,
    /// A joint FP8 product's output (fp8.rs `joint8`): n rows of the members' total rows.
    y8: CudaSlice<f32>,
    inv_freq: HashMap<(u32, usize), CudaSlice<f64>>,
}

/// The start of a profile label (`timed`) for work inside another timed operation, whose time
/// already counts it: a report's total leaves such labels out.
pub const INNER_LABEL: &str = "(inside) ";

/// Most tokens the attention takes at once, and the rings' slack past the sliding window (a
/// piece's K and V are stored before it attends): a micro-batch of more tokens attends in pieces
/// of this many, in order (`attention_pieces`). Also the most sequences a batch mixes.
pub const MAX_UBATCH: usize = 512;
/// Most tokens of one micro-batch on the device (`max_batch_tokens`): its products take all of
/// them at once, so the accurate mode's f16 weights are made once for up to this many tokens
/// (`gemm16`), and its attention runs in pieces of MAX_UBATCH.
pub const MAX_BATCH_TOKENS: usize = 2048;
/// Rows of a weight matrix dequantized at once for the cuBLAS prompt path.
const DEQ_ROWS: usize = 4096;
/// Bytes of f16 weights `gemm16` dequantizes at once (the 30B's FFN matrices, 19968 x 6656,
/// split: 532 MB, in one slab).
const GEMM16_SLAB_BYTES: usize = 640 << 20;

/// The accurate mode's split f16 products (`gemm16`) sum their main product in runs of at most
/// this many columns, each run one cuBLAS call whose result is added in f32. The tensor cores'
/// accumulators truncate their additions, and cuBLAS may sum a whole row in one of them: on an
/// H100 (2026-12-07, gpu.rs `split_f16_products_in_column_runs_meet_the_bound`) one run of
/// 19,968 columns came 2.36e-5 (Q4_K) and 2.46e-5 (Q6_K) of the largest output from the CPU's
/// product (itself within 1.3e-6 of f64), against the bound 2e-5 (`examples/accumulation_probe`
/// models the same). Runs of 2,048 in both of the split form's products cost the accurate
/// prompts 26% there, so the cross product keeps one run (its share of the output is about
/// 2^-11): this form gave at most 6.11e-6 over every format and width on that H100, for 3-4% of
/// the accurate prompts' time.
const GEMM16_RUN_COLUMNS: usize = 4096;

/// `k` columns in runs of equal length (a multiple of 8; the last one may be shorter), at most
/// `most` columns each (0: one run): (first column, length) of each.
fn column_runs(k: usize, most: usize) -> impl Iterator<Item = (usize, usize)> {
    let runs = if most == 0 {
        1
    } else {
        k.div_ceil(most).max(1)
    };
    let step = k.div_ceil(runs).next_multiple_of(8).max(8);
    (0..k).step_by(step).map(move |k0| (k0, step.min(k - k0)))
}

/// A micro-batch of `n` tokens in the attention's pieces: (first row, rows) of at most
/// MAX_UBATCH rows each, in order. Each piece stores its K and V and then attends, so a ring
/// (the window and MAX_UBATCH slots) still holds every key a piece's tokens see (a sequence's
/// positions in a batch are consecutive: `check_batch`). Each piece attends as a micro-batch of
/// its size would (the kernels' choice depends on the token count), so a micro-batch of 2,048
/// attends with the bits of four micro-batches of 512.
fn attention_pieces(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n)
        .step_by(MAX_UBATCH)
        .map(move |r0| (r0, MAX_UBATCH.min(n - r0)))
}

/// The device address of row `r` of rows of `per_row` values of type `T` from `base`: a
/// piece's first row of the batch's activations (f32 rows), positions (a u32 a token) or cache
/// tables (a u64 a token).
fn row_addr<T>(base: u64, r: usize, per_row: usize) -> u64 {
    base + (r * per_row * std::mem::size_of::<T>()) as u64
}

/// The attention's queries, gate and output: the same rows of the same width (the piece
/// offsets in `attend_cached` take q's width for all three).
fn check_attention_rows(q: &CudaAct, gate: Option<&CudaAct>, out: &CudaAct) -> Result<()> {
    check(out, q.rows, q.cols, "attention out")?;
    if let Some(g) = gate {
        check(g, q.rows, q.cols, "attention gate")?;
    }
    Ok(())
}

/// `--f16-weights` and `--fp8-weights` keep copies only while a tenth of the device, and at least
/// this much, stays free after them (`room_for_copy`).
const WEIGHT_COPY_RESERVE_MIN: usize = 4 << 30;
/// Threads of the row-norm kernels: kernels/norm.cu indexes `threadIdx.x + k * 1024` for
/// k < NPT = 8, so exactly 1024 (a smaller block would leave most of a wide row untouched).
const NORM_THREADS: u32 = 1024;
/// `qmma` (kernels/qmma.cu) takes `--mode fast` Q4_K products of more than QMMA_MIN_TOKENS and
/// at most QMMA_MAX_TOKENS tokens (two token warps of four 8-token tiles).
const QMMA_MIN_TOKENS: usize = 8;
const QMMA_MAX_TOKENS: usize = 64;
/// kernels/qmma.cu's shared memory: stages of weight rows, tokens' f16 activations and run sums
/// (bytes per row or token), then each warp's decoded constants for its 32 rows (bytes per
/// row); at most QMMA_MAX_STAGES stages.
const QM_WROW: usize = 160;
const QM_CROW: usize = 112;
const QM_XROW: usize = 576;
const QM_XSROW: usize = 32;
const QMMA_MAX_STAGES: usize = 4;
/// The most dynamic shared memory a `qmma` launch may ask for: an H100/H200 block may have 227
/// KB in all, static shared memory included (the driver refused a limit of exactly 227 KB for a
/// kernel with some, H200 2026-11-30; qmma has none now).
const QMMA_MAX_SMEM: usize = 226 * 1024;

/// The x-stationary kernels' limits (kernels/matvec.cu MVQ_R, MVQ_MAX_THREADS).
const MVQ_R: usize = 4;
const MVQ_MAX_COLS: usize = 640 / 8 * 256;
/// The most tokens of the x-stationary kernels' few-token forms (`_n2`, `_n3` in matvec.cu).
const MVQ_MAX_TOKENS: usize = 3;

macro_rules! mvq_few_table {
    ($($base:literal),* $(,)?) => {
        /// The x-stationary kernels that have few-token forms, each with its 2- and 3-token forms
        /// (kernels/matvec.cu `MVQ_Q4_FEW`, `MVQ_Q6_FEW`, `MVQ_GROUP`, `MVQ_TMA4`, `MVQ_TMA6`).
        pub const MVQ_FEW_KERNELS: &[(&str, &str, &str)] =
            &[$(($base, concat!($base, "_n2"), concat!($base, "_n3"))),*];
    };
}
mvq_few_table!(
    "mvq_q4_k",
    "mvq_q4_k_split",
    "mvq_q4_k_pair",
    "mvq_q4_k_p2",
    "mvq_q4_k_split_p2",
    "mvq_q4_k_pair_p2",
    "mvq_q4_k_group",
    "mvq_q4_k_group_p2",
    "mvq_q6_k",
    "mvq_q6_k_split",
    "mvq_q6_k_pair",
    "mvq_q6_k_p2",
    "mvq_q6_k_split_p2",
    "mvq_q6_k_pair_p2",
    "mvq_q4_k_tma",
    "mvq_q4_k_split_tma",
    "mvq_q4_k_pair_tma",
    "mvq_q4_k_tma_p2",
    "mvq_q4_k_split_tma_p2",
    "mvq_q4_k_pair_tma_p2",
    "mvq_q6_k_tma",
    "mvq_q6_k_split_tma",
    "mvq_q6_k_pair_tma",
    "mvq_q6_k_tma_p2",
    "mvq_q6_k_split_tma_p2",
    "mvq_q6_k_pair_tma_p2",
);

/// The form of x-stationary kernel `name` for `nt` tokens (`MVQ_FEW_KERNELS`): `name` itself for
/// one token.
fn mvq_few_name(name: &'static str, nt: usize) -> Result<&'static str> {
    let few = MVQ_FEW_KERNELS.iter().find(|k| k.0 == name);
    match (nt, few) {
        (1, _) => Ok(name),
        (2, Some(k)) => Ok(k.1),
        (3, Some(k)) => Ok(k.2),
        _ => Err(Error::Backend(format!("no {nt}-token form of {name}"))),
    }
}
/// The most stages of the TMA-staged one-token kernels (MVQ_TMA_MAX_STAGES in matvec.cu).
const MVQ_TMA_MAX_STAGES: usize = 8;
/// The dynamic shared memory the TMA-staged one-token kernels may take (of the H100's and H200's
/// 227 KiB per block): stages are dropped, down to 2, to fit.
const MVQ_TMA_SMEM: usize = 200 * 1024;
/// Most key splits of one token's attention (kernels/kv.cu COMBINE_MAX_SPLITS: attn_combine's
/// shared arrays hold this many).
const ATTN_MAX_SPLITS: usize = 64;
/// Most tokens a product takes on the tensor-core kernels outside the batch-invariant mode.
const MMQ_MAX_TOKENS: usize = 64;
/// Bytes of one stage of a staged tensor-core block with `tb` tokens (kernels/mmq.cu
/// mmq_stage_bytes): the tokens' `planes` digit planes (256 bytes each), run sums (32, Q4_K only),
/// block scales (4) and 64 rows of weights (144 bytes of Q4_K, 208 of Q6_K). A launch holds 3
/// stages.
const fn mmq_stage_bytes(tb: usize, q6: bool, planes: usize) -> usize {
    tb * 256 * planes + if q6 { 0 } else { tb * 32 } + tb * 4 + 64 * if q6 { 208 } else { 144 }
}
/// The most shared memory a staged tensor-core launch uses: 3 stages of 64 tokens of Q6_K, three
/// planes.
/// Devices that cannot give a block this much (before Hopper: A100 gives 163 KiB) take the
/// one-stage kernels.
const MMQ_STAGED_MAX_SMEM: u32 = 3 * mmq_stage_bytes(64, true, 3) as u32;
/// Most (token x split) attention partials at once.
const MAX_PARTS: usize = 4096;

/// What makes two decode steps replayable by one CUDA graph: the token count, the workspace
/// (its buffers are in the graph), the caches' largest context and KV layout (the attention's
/// splits and kernels), and the scratch epoch (every scratch buffer's address and the kernel
/// choices; `scratch_epoch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct StepKey {
    n: usize,
    ws: u64,
    max_ctx: usize,
    kv: i32,
    row_bytes: usize,
    epoch: u64,
}

/// A captured step.
struct StepGraph(cudarc::driver::CudaGraph);
// SAFETY: a CUDA graph and its executable are driver handles, not tied to the thread that
// made them: cudarc's `launch` makes the owning context current first, destroying them (`Drop`)
// needs no current context and records rather than panics on an error, and the graphs live
// behind the backend's Mutex, so one thread at a time touches them.
unsafe impl Send for StepGraph {}

/// Decode steps as CUDA graphs: a shape seen twice in a row is recorded (the first eager step
/// grew every lazily sized buffer), later steps of that shape replay it.
#[derive(Default)]
struct StepGraphs {
    on: bool,
    /// The shape of the last eager step that succeeded.
    warm: Option<StepKey>,
    /// The shape of the eager step under way (becomes `warm` if it succeeds: `step_ran`).
    warming: Option<StepKey>,
    /// Shapes whose recording failed: always eager.
    failed: std::collections::HashSet<StepKey>,
    /// The shape being recorded.
    recording: Option<StepKey>,
    /// The shape `step_record` found recorded (the next `record_replay` launches it).
    replay: Option<StepKey>,
    /// The shape `record_close` just kept (the next `record_run` launches it).
    closed: Option<StepKey>,
    /// Steps replayed so far, and per number of tokens (`MUSER_NCU_STEP`).
    replays: u64,
    replays_of: HashMap<usize, usize>,
    graphs: HashMap<StepKey, StepGraph>,
}

/// `MUSER_NCU_STEP=N:K`: the K-th replayed step of N tokens runs between cuProfilerStart and
/// cuProfilerStop, so that `ncu --profile-from-start off` measures the kernels of that one step
/// (each node of its graph).
fn ncu_step() -> Option<(usize, usize)> {
    static V: std::sync::OnceLock<Option<(usize, usize)>> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        let v = std::env::var("MUSER_NCU_STEP").ok()?;
        let (n, k) = v.split_once(':')?;
        Some((n.trim().parse().ok()?, k.trim().parse().ok()?))
    })
}

/// Whether environment variable `name` is set to `value` (the kernel-choice switches).
fn env_is(name: &str, value: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == value)
}

/// Environment variable `name` as a count (the measurement knobs), if it is set to one.
fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.parse().ok()
}

/// The cache table address of each token of `batch` (`CudaKv::table_addr` of its sequence).
fn seq_table(batch: &Batch, caches: &[&mut CudaKv]) -> Result<Vec<u64>> {
    batch
        .seq
        .iter()
        .map(|&s| {
            caches
                .get(s)
                .map(|c| c.table_addr)
                .ok_or_else(|| Error::Input(format!("batch names sequence {s} without a cache")))
        })
        .collect()
}

/// Most step graphs kept (a new shape past this drops them all; the server's shapes are the
/// running-sequence counts, at most a few dozen).
const MAX_STEP_GRAPHS: usize = 96;

/// How `qmma` (kernels/qmma.cu) cuts a launch. None of it changes a result's bits: the column
/// ranges, the only thing that orders the sums, come from the matrix shape and `wave` alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QmmaShape {
    /// Warps of 32 rows per block (`MUSER_QMMA_WR`, 4; at most 8 / token warps).
    pub row_warps: usize,
    /// Steps of operands in shared memory (`MUSER_QMMA_STAGES`, 2; 2..=4).
    pub stages: usize,
    /// Blocks per SM the column ranges aim for, counting blocks of 128 rows
    /// (`MUSER_QMMA_WAVE`, 3).
    pub wave: usize,
    /// The activations through registers, only the weights in the stages (`MUSER_QMMA_XREG=1`;
    /// with 4 or more row warps).
    pub xreg: bool,
    /// One token warp of eight 8-token tiles for more than 32 tokens instead of two of up to four
    /// (`MUSER_QMMA_NT8=1`; not with `xreg`).
    pub nt8: bool,
}

impl QmmaShape {
    /// The defaults, or the environment's `MUSER_QMMA_*` (for measurements).
    pub fn from_env() -> Self {
        QmmaShape {
            row_warps: qmma_env("MUSER_QMMA_WR", 4),
            stages: qmma_env("MUSER_QMMA_STAGES", 2),
            wave: qmma_env("MUSER_QMMA_WAVE", 3),
            xreg: env_is("MUSER_QMMA_XREG", "1"),
            nt8: env_is("MUSER_QMMA_NT8", "1"),
        }
    }
}

pub struct CudaBackend {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    funcs: std::sync::RwLock<HashMap<String, CudaFunction>>,
    arch: &'static str,
    blas: CudaBlas,
    scratch: Mutex<Option<Scratch>>,
    /// While a graph is being captured, `begin_batch` must not upload (the decoder does it).
    pub(crate) capturing: std::sync::atomic::AtomicBool,
    /// Record steps in the relaxed capture mode (`set_capture_relaxed`).
    capture_relaxed: std::sync::atomic::AtomicBool,
    /// `--mode fast` Q4_K products of QMMA_MIN_TOKENS + 1 ..= QMMA_MAX_TOKENS tokens on the f16
    /// tensor cores straight from the Q4_K blocks (kernels/qmma.cu; `MUSER_QMMA=1`, off by
    /// default: slower than the two-plane integer kernels so far).
    qmma: std::sync::atomic::AtomicBool,
    /// How `qmma` cuts its launches (`MUSER_QMMA_*`, `set_qmma_shape`).
    qmma_shape: Mutex<QmmaShape>,
    /// Decode steps recorded as CUDA graphs, one per step shape (on unless `MUSER_BATCH_GRAPHS=0`).
    step_graphs: Mutex<StepGraphs>,
    device_name: String,
    /// Per-operation GPU timing (eager steps only): (label, start, end) events.
    profile: Mutex<Option<Vec<(String, CudaEvent, CudaEvent)>>>,
    /// Drain the stream before each profiled operation (`set_profile_sync`).
    profile_sync: std::sync::atomic::AtomicBool,
    sm_count: u32,
    /// Whether some matrix's one-token kernel reads the sums of 8 activations (a format without
    /// an `mvq_*` kernel): only then do the norms write them for single-token rows.
    one_token_sums: std::sync::atomic::AtomicBool,
    /// `--mode fast`: two-plane tensor-core kernels for Q4_K and Q6_K, TF32 cuBLAS for the rest.
    fast_mode: std::sync::atomic::AtomicBool,
    /// One launch for the FFN's gate, up and SwiGLU at one token (`ffn_swiglu`).
    fused_ffn: std::sync::atomic::AtomicBool,
    /// `--mode cuda-parity`: products of Q4_0/Q8_0/Q4_K/Q5_K/Q6_K/F16 weights as llama.cpp
    /// b11434's CUDA build computes one token (kernels/parity.cu; the CPU model
    /// cpu/cuda_anchor.rs, bit for bit), every token of a batch alone; the rest accurate.
    cuda_parity: std::sync::atomic::AtomicBool,
    /// Batch-invariant mode: a token's results do not depend on what else shares its micro-batch
    /// (every Q4_K/Q6_K product on the tensor-core kernels, one token at a time for the others,
    /// attention splits independent of the batch size).
    batch_invariant: std::sync::atomic::AtomicBool,
    /// Most 8-token tiles per warp in the tensor-core kernels (1..=4; `MUSER_MMQ_NT`): fewer
    /// means fewer registers and more warps per row group. Every choice gives the same bits.
    mmq_tiles: std::sync::atomic::AtomicUsize,
    /// Whether the tensor-core kernels stage their operands in shared memory (`mmq_s_*`; off
    /// with `MUSER_MMQ_STAGED=0` or when the device's shared memory per block is too small).
    /// Both variants give the same bits.
    mmq_staged: std::sync::atomic::AtomicBool,
    /// Rows per warp in the staged tensor-core kernels: 16, or 32 (`MUSER_MMQ_MR=2`, the
    /// `mmq_s2_*` kernels: each activation fragment serves two tiles of rows). Same bits.
    mmq_rows_per_warp: std::sync::atomic::AtomicUsize,
    /// Q4_K's sub-block scales multiplied into the weight operand (`MUSER_MMQ_SCALEA=1`, the
    /// `mmq_sa_*` kernels: twice the mma, no integer multiply-add per run). Same bits.
    mmq_scale_in_a: std::sync::atomic::AtomicBool,
    /// Whether the FFN's gate and up run as one pair launch of the staged kernels (off with
    /// `MUSER_MMQ_PAIR=0`). Batch-invariant: the same bits either way.
    mmq_pairs: std::sync::atomic::AtomicBool,
    /// Digit planes of the activations in the tensor-core kernels: 3 (exact to 2^-22 of a
    /// 256-value block's largest value; the accurate default), or 2 (`MUSER_MMQ_PLANES=2`, the
    /// staged `mmq_p2_*` kernels: to within 2^-14 of it, two thirds of the tensor-core work; the
    /// variants MR = 2 and scales-in-A keep three).
    mmq_planes: std::sync::atomic::AtomicUsize,
    /// Blocks per SM of the two-plane kernels: 1, or 2 (`MUSER_MMQ_OCC=2`, `mmq_p2o_*`: two
    /// stages, at most 128 registers, 16 warps per SM).
    mmq_occ: std::sync::atomic::AtomicUsize,
    /// One-token products launched with programmatic dependent launch (sm_90 and newer; on by
    /// default, `MUSER_PDL=0` off): their first weights load while the kernel before them
    /// finishes. Its activations are read after the wait (`ld_after_wait`, kernels/common.cuh);
    /// H200, 2026-11-29: decode 123.1 tokens/s with it, 120.8 without (same call), gpu.rs passing.
    pdl: bool,
    /// The small kernels of a decode step (the norms, the SwiGLU, the query and key preparation,
    /// the attention's merge, the logits' finish) launched programmatically too: each waits
    /// (`pdl_wait`, first thing) for the kernel before it, but its launch and its blocks'
    /// scheduling overlap that kernel's end. With `pdl`, unless `MUSER_PDL_SMALL=0`.
    pdl_small: bool,
    /// Digit planes of the one-token x-stationary kernels' activations: 3 (to 2^-22 of a run's
    /// largest value), or 2 in `--mode fast` (to within 2^-14; `MUSER_MVQ_PLANES=2` in the accurate mode,
    /// for comparison).
    mvq_planes: std::sync::atomic::AtomicUsize,
    /// Stages of the x-stationary kernels' TMA-staged forms (`mvq_*_tma`, sm_90 and newer); 0:
    /// the register forms (`MUSER_MVQ_STAGES`, default 3; 0 turns the staged forms off).
    mvq_stages: std::sync::atomic::AtomicUsize,
    /// sm_90 or newer (the TMA, programmatic launches).
    hopper: bool,
    /// `norm_tail` over a cluster of this many blocks a row where no sums of 8 are wanted, on
    /// sm_90 and newer, or 0: one block a row. 16 on sm_90 (a non-portable cluster size), 8 on
    /// newer GPUs, unless `MUSER_NORM_TAIL_CLUSTER=0` (one block) or
    /// `MUSER_NORM_TAIL_CLUSTER_SIZE=8|16`, or `set_norm_tail_cluster`. H200, alternating in one
    /// call: 8 against one block a row, decode 150.26/150.29 tokens/s against 147.88/147.86
    /// (2026-11-30, twelfth session); 16 against 8, 153.52/153.48 against 152.32/152.42
    /// (2026-12-01, thirteenth session; 4 blocks, since removed, 149.75/149.09).
    norm_tail_cluster: std::sync::atomic::AtomicU32,
    /// The smallest launch (bytes of weights) the staged forms take (`MUSER_MVQ_TMA_MIN_MB`, default
    /// 50: the 30B's Q4_K FFN down projections, 75 MB, too; H200, 2026-11-30, twelfth session:
    /// 151.94/152.11/152.08 tokens/s against 151.08/151.06/150.93 at 100 MB, alternating in one call).
    mvq_tma_min_bytes: std::sync::atomic::AtomicUsize,
    /// Products of more than 64 tokens in one launch of the staged kernels, 64 tokens per grid
    /// layer (on unless `MUSER_MMQ_ZGRID=0`), instead of one launch per 64 tokens. Same bits per token.
    mmq_zgrid: std::sync::atomic::AtomicBool,
    /// The lean launches of a few tokens' tensor-core products (`set_mmq_lean`; off unless
    /// `MUSER_MMQ_FUSED_SUM=1`, `MUSER_XQ_PAD_TB=1`, `MUSER_XQ_REUSE=1`): a split's ranges added
    /// by its last blocks, planes made for the launch's block tokens, x's planes made once per
    /// group. The same bits either way. Written after the profile of a 2-sequence step on the
    /// H200 (docs/BENCHMARKS.md, twenty-eighth session: 416 mmq_reduce launches took 1.03 ms and
    /// 287 xq_planes 1.09 ms of its 12.5). gpu.rs `lean_few_token_products_give_the_default_bits`
    /// passed on the H200, but they were not faster (thirty-second session, 30B Q4_K_M, fast
    /// mode: 4 sequences' batched decode 327.7 against 339.4 tokens/s, 3 sequences 246.8
    /// against 256.0, 2 sequences 167.6 against 171.5), so they stay off.
    mmq_fused_sum: std::sync::atomic::AtomicBool,
    /// Products of 2 to this many tokens (at most MVQ_MAX_TOKENS) on the x-stationary kernels'
    /// few-token forms (`mvq_*_n2`, `_n3`: the weights read once, each token's arithmetic and bits
    /// as in a one-token launch), not the tensor-core ones (`MUSER_MVQ_TOKENS`, default
    /// MVQ_MAX_TOKENS; 1: off). The tensor-core products of a few tokens are bound by
    /// instructions, not memory (Nsight, H200, docs/BENCHMARKS.md, twenty-eighth session: a
    /// 2-token FFN pair at 48% of DRAM peak). Measured on the H200 (docs/BENCHMARKS.md,
    /// thirty-second session), 30B Q4_K_M, `--mode fast --fp8-weights`: 2 sequences' batched
    /// decode 230.5 against 171.5 tokens/s, 3 sequences 282.8 against 256.0, prompt chunks of 2
    /// and 3 tokens 222 and 280 against 160 and 238; 4 and 5 tokens stay on the tensor cores.
    mvq_tokens: std::sync::atomic::AtomicUsize,
    xq_pad_tb: std::sync::atomic::AtomicBool,
    xq_reuse: std::sync::atomic::AtomicBool,
    /// Products of more than `gemm16_min` tokens (prompts) on the f16 tensor cores through
    /// cuBLAS (`gemm16`; off with `MUSER_GEMM16=0`): the split form in the accurate mode (F32
    /// weights excepted: they keep f32 cuBLAS), one f16 product in `--mode fast`.
    gemm16: std::sync::atomic::AtomicBool,
    /// Token count above which `gemm16` takes a product (`MUSER_GEMM16_MIN`, default 64: batched
    /// decode steps keep the exact integer kernels).
    gemm16_min: std::sync::atomic::AtomicUsize,
    /// The accurate mode's `gemm16` (the split form) sums its main product (hi . hi) in runs of
    /// at most this many columns, one cuBLAS call each, the runs' results added in f32
    /// (`MUSER_GEMM16_KCHUNK`, default GEMM16_RUN_COLUMNS; 0: one run of all the columns).
    gemm16_kchunk: std::sync::atomic::AtomicUsize,
    /// The token count above which `gemm16` takes a product with `--f16-weights` in `--mode
    /// fast` (`MUSER_GEMM16_MIN_KEPT`, default 48).
    gemm16_min_kept: std::sync::atomic::AtomicUsize,
    /// `--f16-weights` (`MUSER_F16_WEIGHTS=1`): in `--mode fast`, each matrix that `gemm16`
    /// multiplies keeps an f16 copy (2 bytes per weight, made once), so that its products of
    /// many tokens read f16 weights instead of dequantizing every time.
    f16_weights: std::sync::atomic::AtomicBool,
    /// `--fp8-weights` (`MUSER_FP8_WEIGHTS=1`, fp8.rs): in `--mode fast`, products of more than
    /// `gemm8_min` tokens (`MUSER_GEMM8_MIN`, default 16) on the FP8 tensor cores, each matrix
    /// keeping an e4m3 copy (1 byte per weight). With the joint products (fp8.rs `joint8`),
    /// 32 sequences decode faster on FP8 than on the two-plane integer kernels (H200,
    /// 2026-11-30, tokens drawn on the GPU: 2,050.4 tokens/s aggregate against 1,657.7); before
    /// them the integer kernels were faster at 32 (1,412.7 against 1,349.4). Batches of 17 to 31
    /// tokens were not measured: the FP8 step costs about the same at any size (it reads every
    /// e4m3 weight once), the integer kernels' grows with the tokens, so the crossover lies
    /// somewhere below 32.
    fp8_weights: std::sync::atomic::AtomicBool,
    gemm8_min: std::sync::atomic::AtomicUsize,
    /// The FP8 products' scales applied by cuBLASLt where it can (off with `MUSER_FP8_OUTER=0`:
    /// by `y_scale_outer` after it). The same values either way.
    fp8_outer: std::sync::atomic::AtomicBool,
    /// The most tokens an FP8 product may have for its algorithm and scale form to be timed
    /// per shape (fp8::FP8_TUNE_MAX_TOKENS by default, the decode batches; `MUSER_FP8_TUNE=1`
    /// every product, `MUSER_FP8_TUNE=0` none: cuBLASLt's first choice with outer-vector
    /// scales), and the fewest rows a matrix needs to take them (`MUSER_FP8_MIN_ROWS`).
    fp8_tune_max: std::sync::atomic::AtomicUsize,
    fp8_min_rows: std::sync::atomic::AtomicUsize,
    /// cuBLASLt's handle, workspace and chosen algorithms (made by set_fp8_weights).
    lt: Mutex<Option<fp8::Lt>>,
    /// Products run on the FP8 tensor cores so far (`fp8_products`).
    fp8_count: std::sync::atomic::AtomicU64,
    /// The device's compute capability.
    cc: (i32, i32),
    /// Prompt chunks' attention on the tensor cores (`attn_tc`, on unless `MUSER_ATTN_TC=0`).
    attn_tc: std::sync::atomic::AtomicBool,
    /// Batched decode attention on the tensor cores: 0 off (`MUSER_ATTN_TCD=0`), 1 `attn_tcd`
    /// (`MUSER_ATTN_TCD=1`), 2 `attn_tcd2` (the default: cp.async staging, the same bits; 4.4%
    /// to 7.6% more tokens/s at 32 and 64 sequences, H200 2026-11-30).
    attn_tcd: std::sync::atomic::AtomicU8,
    /// The most dynamic shared memory one block may opt into (bytes).
    smem_optin: u32,
    /// Kernel attributes set so far, each once (`set_attribute_once`'s keys).
    attributes_set: Mutex<std::collections::HashSet<String>>,
    /// Inside `matmul_group` (its products read one x, which nothing writes meanwhile): the
    /// tensor-core products convert x to planes once (`Scratch::xq_made`).
    in_group: std::sync::atomic::AtomicBool,
    /// Bumped when a scratch buffer is reallocated (`scratch_epoch`).
    scratch_epoch: std::sync::atomic::AtomicU64,
    /// Resident blocks per SM of (kernel, block size), from the occupancy calculator.
    waves: Mutex<HashMap<(&'static str, u32, u32), u32>>,
    /// Page-locked buffers for large reads to the host (`download`), made at the first; off
    /// (every read to pageable memory) with `MUSER_STAGED_READS=0`.
    staging: Mutex<Option<staging::Staging>>,
    staged_reads: bool,
}

/// The kernels that take a row's runs of 8 values a thread (`w16_rows`, `x16_split`,
/// `w8_rows`): blocks of 128 threads across `cols`, grid rows over `rows` (strided past 65,535).
fn grid_runs8(cols: usize, rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            (cols / 8).div_ceil(128) as u32,
            (rows as u32).clamp(1, 65_535),
            1,
        ),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of 1024 threads for each of `n` rows.
fn per_row(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn grid1(n: usize, threads: u32) -> LaunchConfig {
    let blocks = (n as u32).div_ceil(threads).clamp(1, 65_535);
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaBackend {
    /// Open device `ordinal`, compile (or load cached) kernels for its architecture.
    pub fn new(ordinal: usize) -> Result<Self> {
        check_libraries()?;
        let n = CudaContext::device_count().map_err(dev("device count"))?;
        if i32::try_from(ordinal).map_or(true, |o| o >= n) {
            return Err(Error::Backend(format!(
                "CUDA device {ordinal} does not exist ({n} device(s) found)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(dev("context"))?;
        // One stream, so cudarc's cross-stream event tracking only costs time (and events).
        // SAFETY: every launch and copy of this backend goes to `stream`, in order.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own: the legacy default stream cannot be captured into a graph.
        let stream = ctx.new_stream().map_err(dev("stream"))?;
        let cc = ctx
            .compute_capability()
            .map_err(dev("compute capability"))?;
        let arch = kernels::arch_for(cc)?;
        let funcs = kernels::load_all(&ctx, arch)?;
        let blas = CudaBlas::new(stream.clone()).map_err(dev("cuBLAS"))?;
        let device_name = format!("{} (sm_{}{})", ctx.name().unwrap_or_default(), cc.0, cc.1);
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(dev("multiprocessor count"))?
            .max(1) as u32;
        let smem_optin = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(dev("shared memory per block"))?
            .max(0) as u32;
        // (The read-only activation loads of X_LOAD=2 are wrong under PDL: kernels/common.cuh.)
        let pdl = !env_is("MUSER_PDL", "0")
            && cc.0 >= 9
            && !kernels::env_defines().iter().any(|d| {
                d.strip_prefix("X_LOAD=")
                    .is_some_and(|v| v.trim().parse::<i64>().ok() == Some(2))
            });
        let b = CudaBackend {
            ctx,
            stream,
            funcs: std::sync::RwLock::new(funcs),
            arch,
            blas,
            scratch: Mutex::new(None),
            capturing: std::sync::atomic::AtomicBool::new(false),
            capture_relaxed: std::sync::atomic::AtomicBool::new(false),
            qmma: std::sync::atomic::AtomicBool::new(env_is("MUSER_QMMA", "1")),
            qmma_shape: Mutex::new(QmmaShape::from_env()),
            step_graphs: Mutex::new(StepGraphs {
                on: !env_is("MUSER_BATCH_GRAPHS", "0"),
                ..StepGraphs::default()
            }),
            device_name,
            profile: Mutex::new(None),
            profile_sync: std::sync::atomic::AtomicBool::new(false),
            sm_count,
            one_token_sums: std::sync::atomic::AtomicBool::new(false),
            fast_mode: std::sync::atomic::AtomicBool::new(false),
            fused_ffn: std::sync::atomic::AtomicBool::new(env_is("MUSER_FUSE", "1")),
            cuda_parity: std::sync::atomic::AtomicBool::new(false),
            waves: Mutex::new(HashMap::new()),
            staging: Mutex::new(None),
            staged_reads: !env_is("MUSER_STAGED_READS", "0"),
            batch_invariant: std::sync::atomic::AtomicBool::new(env_is(
                "MUSER_BATCH_INVARIANT",
                "1",
            )),
            scratch_epoch: std::sync::atomic::AtomicU64::new(0),
            mmq_staged: std::sync::atomic::AtomicBool::new(!env_is("MUSER_MMQ_STAGED", "0")),
            smem_optin,
            gemm16: std::sync::atomic::AtomicBool::new(!env_is("MUSER_GEMM16", "0")),
            attn_tc: std::sync::atomic::AtomicBool::new(!env_is("MUSER_ATTN_TC", "0")),
            attn_tcd: std::sync::atomic::AtomicU8::new(if env_is("MUSER_ATTN_TCD", "0") {
                0
            } else if env_is("MUSER_ATTN_TCD", "1") {
                1
            } else {
                2
            }),
            f16_weights: std::sync::atomic::AtomicBool::new(env_is("MUSER_F16_WEIGHTS", "1")),
            fp8_weights: std::sync::atomic::AtomicBool::new(false),
            gemm8_min: std::sync::atomic::AtomicUsize::new(
                env_usize("MUSER_GEMM8_MIN").unwrap_or(16),
            ),
            fp8_outer: std::sync::atomic::AtomicBool::new(!env_is("MUSER_FP8_OUTER", "0")),
            fp8_tune_max: std::sync::atomic::AtomicUsize::new(if env_is("MUSER_FP8_TUNE", "0") {
                0
            } else if env_is("MUSER_FP8_TUNE", "1") {
                usize::MAX
            } else {
                fp8::FP8_TUNE_MAX_TOKENS
            }),
            fp8_min_rows: std::sync::atomic::AtomicUsize::new(
                env_usize("MUSER_FP8_MIN_ROWS").unwrap_or(fp8::FP8_MIN_ROWS),
            ),
            lt: Mutex::new(None),
            fp8_count: std::sync::atomic::AtomicU64::new(0),
            cc,
            gemm16_min_kept: std::sync::atomic::AtomicUsize::new(
                env_usize("MUSER_GEMM16_MIN_KEPT").unwrap_or(48),
            ),
            gemm16_kchunk: std::sync::atomic::AtomicUsize::new(
                env_usize("MUSER_GEMM16_KCHUNK")
                    .map_or(GEMM16_RUN_COLUMNS, |k| k.next_multiple_of(8)),
            ),
            gemm16_min: std::sync::atomic::AtomicUsize::new(
                env_usize("MUSER_GEMM16_MIN").unwrap_or(MMQ_MAX_TOKENS),
            ),
            mmq_scale_in_a: std::sync::atomic::AtomicBool::new(env_is("MUSER_MMQ_SCALEA", "1")),
            mmq_pairs: std::sync::atomic::AtomicBool::new(!env_is("MUSER_MMQ_PAIR", "0")),
            mmq_planes: std::sync::atomic::AtomicUsize::new(env_planes()),
            mvq_planes: std::sync::atomic::AtomicUsize::new(env_mvq_planes()),
            mvq_stages: std::sync::atomic::AtomicUsize::new(if cc.0 >= 9 {
                env_mvq_stages()
            } else {
                0
            }),
            hopper: cc.0 >= 9,
            norm_tail_cluster: std::sync::atomic::AtomicU32::new(
                if env_is("MUSER_NORM_TAIL_CLUSTER", "0") {
                    0
                } else {
                    match env_usize("MUSER_NORM_TAIL_CLUSTER_SIZE") {
                        Some(8) => 8,
                        Some(16) => 16,
                        _ if cc == (9, 0) => 16,
                        _ => 8,
                    }
                },
            ),
            mvq_tma_min_bytes: std::sync::atomic::AtomicUsize::new(
                env_usize("MUSER_MVQ_TMA_MIN_MB").unwrap_or(50) << 20,
            ),
            pdl,
            pdl_small: pdl && !env_is("MUSER_PDL_SMALL", "0"),
            mmq_zgrid: std::sync::atomic::AtomicBool::new(!env_is("MUSER_MMQ_ZGRID", "0")),
            mmq_fused_sum: std::sync::atomic::AtomicBool::new(env_is("MUSER_MMQ_FUSED_SUM", "1")),
            mvq_tokens: std::sync::atomic::AtomicUsize::new(
                env_usize("MUSER_MVQ_TOKENS")
                    .filter(|n| (1..=MVQ_MAX_TOKENS).contains(n))
                    .unwrap_or(MVQ_MAX_TOKENS),
            ),
            xq_pad_tb: std::sync::atomic::AtomicBool::new(env_is("MUSER_XQ_PAD_TB", "1")),
            xq_reuse: std::sync::atomic::AtomicBool::new(env_is("MUSER_XQ_REUSE", "1")),
            mmq_occ: std::sync::atomic::AtomicUsize::new(env_blocks_per_sm()),
            mmq_rows_per_warp: std::sync::atomic::AtomicUsize::new(
                if env_is("MUSER_MMQ_MR", "2") { 32 } else { 16 },
            ),
            attributes_set: Mutex::new(std::collections::HashSet::new()),
            in_group: std::sync::atomic::AtomicBool::new(false),
            mmq_tiles: std::sync::atomic::AtomicUsize::new(
                env_usize("MUSER_MMQ_NT")
                    .filter(|n| (1..=4).contains(n))
                    .unwrap_or(4),
            ),
        };
        if env_is("MUSER_FP8_WEIGHTS", "1") {
            b.set_fp8_weights(true)?;
        }
        Ok(b)
    }

    /// Record steps in CUDA's relaxed capture mode instead of the thread-local one: for the
    /// ranks of a tensor-parallel step, which one host thread records together (while one rank
    /// records, the thread uploads to and synchronises the next rank's stream, calls the
    /// thread-local mode may refuse). The guards the thread-local mode gives (no allocation while
    /// recording) are kept by the scratch epoch check and the tensor-parallel backend's own.
    pub fn set_capture_relaxed(&self, on: bool) {
        self.capture_relaxed
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// `--mode fast` Q4_K products of 9 to 64 tokens on the f16 tensor cores straight from the
    /// Q4_K blocks (kernels/qmma.cu): exact weights, only the activations rounded to f16. Off by
    /// default (`MUSER_QMMA=1` on): on the H200 it is still slower than the two-plane integer
    /// kernels (docs/BENCHMARKS.md, 2026-11-30, fourth session).
    pub fn set_qmma(&self, on: bool) {
        self.set_switch(&self.qmma, on);
    }

    /// How `qmma` cuts its launches (the same results whatever the shape).
    pub fn set_qmma_shape(&self, shape: QmmaShape) -> Result<()> {
        *self
            .qmma_shape
            .lock()
            .map_err(|_| Error::Backend("qmma shape lock poisoned".into()))? = shape;
        self.bump_epoch();
        Ok(())
    }

    /// The f16 tensor-core products for prompts (`gemm16`): on by default, `MUSER_GEMM16=0` off.
    pub fn set_gemm16(&self, on: bool) {
        self.gemm16.store(on, std::sync::atomic::Ordering::Relaxed);
        self.bump_epoch();
    }

    /// `--f16-weights`: keep an f16 copy of each matrix `gemm16` multiplies (made at its first
    /// such product while there is room, `room_for_copy`; `--mode fast`: hi, 2 bytes per weight
    /// of device memory; the accurate mode: the split form's hi and lo, 4 bytes).
    pub fn set_f16_weights(&self, on: bool) {
        self.f16_weights
            .store(on, std::sync::atomic::Ordering::Relaxed);
        self.bump_epoch();
    }

    /// Prompt chunks' attention on the tensor cores (`attn_tc`): on by default.
    pub fn set_attn_tc(&self, on: bool) {
        self.attn_tc.store(on, std::sync::atomic::Ordering::Relaxed);
        self.bump_epoch();
    }

    /// Batched decode attention on the tensor cores: 0 off (the CUDA-core kernel), 1
    /// `attn_tcd`, 2 `attn_tcd2` (the default; tests: each against the others).
    pub fn set_attn_tcd(&self, level: u8) {
        self.attn_tcd
            .store(level.min(2), std::sync::atomic::Ordering::Relaxed);
        self.bump_epoch();
    }

    /// The accurate mode's `gemm16` sums its main product in runs of at most `k` columns per
    /// cuBLAS call (rounded up to a multiple of 8; 0: one run of all of them; the default
    /// GEMM16_RUN_COLUMNS; `MUSER_GEMM16_KCHUNK`).
    pub fn set_gemm16_kchunk(&self, k: usize) {
        self.gemm16_kchunk
            .store(k.next_multiple_of(8), std::sync::atomic::Ordering::Relaxed);
        self.bump_epoch();
    }

    /// The longest run of columns in the accurate mode's `gemm16` main product (0: one run).
    pub fn gemm16_kchunk(&self) -> usize {
        self.gemm16_kchunk
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `gemm16` takes products of more than `n` tokens (default 64, `MUSER_GEMM16_MIN`).
    pub fn set_gemm16_min_tokens(&self, n: usize) {
        self.gemm16_min
            .store(n, std::sync::atomic::Ordering::Relaxed);
        self.bump_epoch();
    }

    /// `--mode fast`: products of more than 64 tokens (prompts) in one f16 product on the tensor
    /// cores (`gemm16`: weights and activations each rounded to f16 after a power-of-two scale,
    /// f32 sums); products of several tokens up to 64 (batched decode steps) in Q4_K and
    /// Q6_K run on the two-plane tensor-core kernels (activations to within 2^-14 of a 256-value
    /// block's largest value instead of 2^-22) at two blocks per multiprocessor; the other
    /// formats' prompt products multiply on the TF32 tensor cores (the exactly dequantized
    /// weights and the activations rounded to 10-bit mantissas inside cuBLAS, f32 sums).
    /// One-token decode runs the x-stationary kernels with two planes too (within 2^-14 of a 16- or
    /// 8-value run's largest value; the fused FFN kernel keeps three). Off: the planes and
    /// blocks per SM go back to their defaults (3 and 1, or what `MUSER_MMQ_PLANES`,
    /// `MUSER_MMQ_OCC` and `MUSER_MVQ_PLANES` say). Its error against the accurate mode is
    /// measured in docs/PARITY.md.
    pub fn set_fast_mode(&self, on: bool) -> Result<()> {
        use cudarc::cublas::sys::{cublasMath_t, cublasSetMathMode, cublasStatus_t};
        let mode = if on {
            cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
        } else {
            cublasMath_t::CUBLAS_DEFAULT_MATH
        };
        // SAFETY: the handle is this backend's live cuBLAS handle; setting its math mode only
        // changes how later SGEMMs on it compute.
        let st = unsafe { cublasSetMathMode(*self.blas.handle(), mode) };
        if st != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(Error::Backend(format!("cuBLAS math mode: {st:?}")));
        }
        self.fast_mode
            .store(on, std::sync::atomic::Ordering::Relaxed);
        self.set_mmq_planes(if on { 2 } else { env_planes() });
        self.set_mmq_blocks_per_sm(if on { 2 } else { env_blocks_per_sm() });
        self.set_mvq_planes(if on { 2 } else { env_mvq_planes() });
        // A recorded step holds the other mode's kernels.
        self.bump_epoch();
        Ok(())
    }

    /// Batch-invariant mode (`--batch-invariant`): a sequence's tokens come out bit for bit the
    /// same whatever else shares its micro-batches (with caches of one context size). Costs the
    /// one-token kernels: decode steps use the tensor-core kernels for a single token too.
    pub fn set_batch_invariant(&self, on: bool) {
        self.batch_invariant
            .store(on, std::sync::atomic::Ordering::Relaxed);
        // A captured graph recorded the other mode's kernels.
        self.bump_epoch();
    }

    /// At most `n` (1..=4) tiles of 8 tokens per warp in the tensor-core kernels (a launch of
    /// 64 tokens then takes 8 / n warps per row group). Results do not change; speed may.
    pub fn set_mmq_tiles_per_warp(&self, n: usize) {
        self.set_choice(&self.mmq_tiles, n.clamp(1, 4));
    }

    /// Whether the tensor-core kernels stage their operands in shared memory (same bits either
    /// way; for tests and comparisons).
    pub fn set_mmq_staged(&self, on: bool) {
        self.set_switch(&self.mmq_staged, on);
    }

    /// 16 or 32 rows per warp in the staged tensor-core kernels (results do not change).
    pub fn set_mmq_rows_per_warp(&self, rows: usize) {
        self.set_choice(&self.mmq_rows_per_warp, if rows == 32 { 32 } else { 16 });
    }

    /// Q4_K's sub-block scales in the weight operand of the staged kernels (results do not
    /// change).
    pub fn set_mmq_scale_in_a(&self, on: bool) {
        self.set_switch(&self.mmq_scale_in_a, on);
    }

    /// Digit planes of the tensor-core kernels' activations: 3 (exact to 2^-22 of a block's
    /// largest value) or 2 (to within 2^-14; faster). Anything else is taken as 3.
    pub fn set_mmq_planes(&self, planes: usize) {
        self.set_choice(&self.mmq_planes, if planes == 2 { 2 } else { 3 });
    }

    /// Digit planes of the one-token kernels' activations: 2 (`--mode fast`) or 3. Anything
    /// else is taken as 3.
    pub fn set_mvq_planes(&self, planes: usize) {
        self.set_choice(&self.mvq_planes, if planes == 2 { 2 } else { 3 });
    }

    /// Stages of the one-token kernels' TMA-staged forms (2..=8), or 0 for their register forms
    /// (the same bits). Before sm_90 the register forms stay, whatever is asked.
    pub fn set_mvq_stages(&self, n: usize) {
        let n = if n == 0 || !self.hopper {
            0
        } else {
            n.clamp(2, MVQ_TMA_MAX_STAGES)
        };
        self.set_choice(&self.mvq_stages, n);
    }

    /// The smallest launch, in bytes of weights, the staged one-token kernels take (smaller ones
    /// keep the register forms).
    pub fn set_mvq_tma_min_bytes(&self, bytes: usize) {
        self.set_choice(&self.mvq_tma_min_bytes, bytes);
    }

    /// The staged one-token kernels' stages now (0: the register forms).
    pub fn mvq_stages(&self) -> usize {
        self.mvq_stages.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Decode steps recorded as CUDA graphs and replayed (or every step launched kernel by
    /// kernel). Turning them off drops the recordings.
    pub fn set_batch_graphs(&self, on: bool) {
        if let Ok(mut g) = self.step_graphs.lock() {
            g.on = on;
            if !on {
                g.graphs.clear();
                g.warm = None;
                g.failed.clear();
            }
        }
    }

    /// Decode steps replayed from recordings since the backend was made.
    pub fn step_graph_replays(&self) -> u64 {
        self.step_graphs.lock().map(|g| g.replays).unwrap_or(0)
    }

    /// Products of more than 64 tokens in one launch (grid layers of 64 tokens) or a launch per
    /// 64 tokens (results do not change).
    pub fn set_mmq_zgrid(&self, on: bool) {
        self.set_switch(&self.mmq_zgrid, on);
    }

    /// The lean launches of the tensor-core products (all three of `MUSER_MMQ_FUSED_SUM`,
    /// `MUSER_XQ_PAD_TB`, `MUSER_XQ_REUSE`) on or off. Same bits.
    pub fn set_mmq_lean(&self, on: bool) {
        for flag in [&self.mmq_fused_sum, &self.xq_pad_tb, &self.xq_reuse] {
            self.set_switch(flag, on);
        }
    }

    /// Products of 2 to `n` tokens on the x-stationary kernels' few-token forms (`n` at most
    /// MVQ_MAX_TOKENS; 1 or 0: none, the tensor-core kernels take them). Each token's bits are
    /// those of a one-token launch.
    pub fn set_mvq_tokens(&self, n: usize) {
        self.set_choice(&self.mvq_tokens, n.clamp(1, MVQ_MAX_TOKENS));
    }

    /// Blocks per SM of the two-plane kernels (1, or 2: `mmq_p2o_*`). Anything else is taken as 1.
    pub fn set_mmq_blocks_per_sm(&self, n: usize) {
        self.set_choice(&self.mmq_occ, if n == 2 { 2 } else { 1 });
    }

    /// The FFN's gate and up in one pair launch of the tensor-core kernels, or one after the
    /// other.
    pub fn set_mmq_pairs(&self, on: bool) {
        self.set_switch(&self.mmq_pairs, on);
    }

    /// A kernel-choice switch: set, and stale any recording (it holds the other choice's kernels).
    fn set_switch(&self, flag: &std::sync::atomic::AtomicBool, on: bool) {
        flag.store(on, std::sync::atomic::Ordering::Relaxed);
        self.bump_epoch();
    }

    /// A numeric kernel choice (planes, tiles, rows, blocks per SM), as `set_switch`.
    fn set_choice(&self, value: &std::sync::atomic::AtomicUsize, n: usize) {
        value.store(n, std::sync::atomic::Ordering::Relaxed);
        self.bump_epoch();
    }

    /// Set `attr` of kernel `f` to `value` the first time `key` comes (a kernel's name, or a name
    /// for one of its attributes), not again; `what` names the attribute in an error.
    fn set_attribute_once(
        &self,
        key: &str,
        f: &CudaFunction,
        attr: cudarc::driver::sys::CUfunction_attribute,
        value: i32,
        what: &'static str,
    ) -> Result<()> {
        let mut g = self
            .attributes_set
            .lock()
            .map_err(|_| Error::Backend("kernel attribute table lock poisoned".into()))?;
        if !g.contains(key) {
            f.set_attribute(attr, value).map_err(dev(what))?;
            g.insert(key.to_string());
        }
        Ok(())
    }

    /// Raise kernel `name`'s dynamic shared memory limit to `bytes` (once; `bytes` is the most
    /// any launch of it asks for).
    fn raise_smem(&self, name: &str, f: &CudaFunction, bytes: u32) -> Result<()> {
        self.set_attribute_once(
            name,
            f,
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
            "shared memory limit",
        )
    }

    /// `dst` = `src` on the host, returned once complete: reads of STAGED_READ_MIN_BYTES or
    /// more through the page-locked staging buffers (staging.rs), smaller ones straight to
    /// pageable memory.
    fn download(&self, src: &cudarc::driver::CudaView<'_, f32>, dst: &mut [f32]) -> Result<()> {
        if dst.len() * 4 < staging::STAGED_READ_MIN_BYTES || !self.staged_reads {
            // A copy to pageable memory returns once it is complete.
            return self.stream.memcpy_dtoh(src, dst).map_err(dev("download"));
        }
        let mut g = self
            .staging
            .lock()
            .map_err(|_| Error::Backend("staging buffers poisoned".into()))?;
        if g.is_none() {
            *g = Some(staging::Staging::new(&self.ctx)?);
        }
        match g.as_mut() {
            Some(st) => st.download(&self.stream, src, dst),
            None => Err(Error::Backend("no staging buffers".into())),
        }
    }

    fn invariant(&self) -> bool {
        self.batch_invariant
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Compute the FFN's gate, up and SwiGLU of one token in one launch (Q4_K gate and up).
    /// Products as llama.cpp's CUDA build computes them (`--mode cuda-parity`; `cuda_parity`).
    pub fn set_cuda_parity(&self, on: bool) {
        self.set_switch(&self.cuda_parity, on);
    }

    fn parity_for(&self, w: &CudaMatrix) -> bool {
        self.cuda_parity.load(std::sync::atomic::Ordering::Relaxed)
            && cuda_anchor::models(w.ty)
            && w.cols
                % if w.ty == GgmlType::F16 {
                    2
                } else {
                    w.ty.block_size()
                }
                == 0
    }

    /// `out = W x` by kernels/parity.cu: x quantized to q8_1 (`pq_quantize`) then `pq_mmvq_*`
    /// (128 threads per row), or `pq_mmvf_f16`; one grid row per token.
    fn matmul_parity(&self, w: &CudaMatrix, x: &CudaAct, out: &mut CudaAct) -> Result<()> {
        let (rows, cols, n) = (w.rows as i32, w.cols as i32, x.rows as u32);
        if w.ty == GgmlType::F16 {
            let bs = cuda_anchor::mmvf_block(w.cols) as u32;
            let func = self.f("pq_mmvf_f16")?;
            let mut b = self.stream.launch_builder(&func);
            b.arg(&w.data)
                .arg(&rows)
                .arg(&cols)
                .arg(&x.data)
                .arg(&mut out.data);
            let cfg = LaunchConfig {
                grid_dim: (w.rows as u32, n, 1),
                block_dim: (bs, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: reads rows x cols f16 weights and n rows of x, writes n x rows outputs
            // (`matmul` checked the shapes); bs is a multiple of 32 up to 256.
            unsafe { b.launch(cfg) }.map_err(dev("pq_mmvf_f16"))?;
            return Ok(());
        }
        let name = match w.ty {
            GgmlType::Q4_0 => "pq_mmvq_q4_0",
            GgmlType::Q8_0 => "pq_mmvq_q8_0",
            GgmlType::Q4_K => "pq_mmvq_q4_k",
            GgmlType::Q5_K => "pq_mmvq_q5_k",
            _ => "pq_mmvq_q6_k",
        };
        let nblk = x.rows * w.cols / 32;
        let mut g = self.scratch()?;
        let s = g
            .as_mut()
            .ok_or_else(|| Error::Backend("no scratch".into()))?;
        self.grow(&mut s.pq_q, x.rows * w.cols)?;
        self.grow(&mut s.pq_d, nblk)?;
        self.grow(&mut s.pq_s, nblk)?;
        {
            let func = self.f("pq_quantize")?;
            let mut b = self.stream.launch_builder(&func);
            let ntok = x.rows as i32;
            b.arg(&x.data)
                .arg(&cols)
                .arg(&ntok)
                .arg(&mut s.pq_q)
                .arg(&mut s.pq_d)
                .arg(&mut s.pq_s);
            // SAFETY: one warp per block of 32 of the n x cols activations (8 per 256 threads,
            // the kernel stops past the last); writes n x cols quanta and a scale and sum per
            // block (grown above).
            unsafe { b.launch(grid1(nblk * 32, 256)) }.map_err(dev("pq_quantize"))?;
        }
        let func = self.f(name)?;
        let mut b = self.stream.launch_builder(&func);
        b.arg(&w.data)
            .arg(&w.nbt)
            .arg(&rows)
            .arg(&cols)
            .arg(&s.pq_q)
            .arg(&s.pq_d)
            .arg(&s.pq_s)
            .arg(&mut out.data);
        let cfg = LaunchConfig {
            grid_dim: (w.rows as u32, n, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: reads the matrix's nbt blocks in its device layout and n rows of q8_1
        // activations, writes n x rows outputs (`matmul` checked the shapes).
        unsafe { b.launch(cfg) }.map_err(dev(name))?;
        Ok(())
    }

    /// Whether the device is sm_90 or newer (the TMA, programmatic launches, clusters).
    pub fn hopper(&self) -> bool {
        self.hopper
    }

    /// The blocks of `norm_tail`'s cluster form where it can take it, or 0 (one block a row).
    pub fn norm_tail_cluster(&self) -> u32 {
        self.norm_tail_cluster
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `norm_tail` over a cluster of `blocks` blocks a row (8, or 16: the default on sm_90), or
    /// with 0 one block a row.
    pub fn set_norm_tail_cluster(&self, blocks: u32) -> Result<()> {
        if !matches!(blocks, 0 | 8 | 16) {
            return Err(Error::Backend(format!(
                "norm_tail clusters of {blocks} blocks: 0, 8 or 16"
            )));
        }
        self.norm_tail_cluster
            .store(blocks, std::sync::atomic::Ordering::Relaxed);
        self.bump_epoch();
        Ok(())
    }

    pub fn set_fused_ffn(&self, on: bool) {
        self.fused_ffn
            .store(on, std::sync::atomic::Ordering::Relaxed);
        self.bump_epoch();
    }

    fn f(&self, name: &str) -> Result<CudaFunction> {
        let g = self
            .funcs
            .read()
            .map_err(|_| Error::Backend("kernel table lock poisoned".into()))?;
        g.get(name)
            .cloned()
            .ok_or_else(|| Error::Backend(format!("kernel {name} is missing")))
    }

    /// Compile and load the attention kernels for this model's head geometry (once).
    fn ensure_attention(&self, nrep: usize, hd: usize) -> Result<()> {
        let probe = format!("attn_{nrep}_{hd}_f16");
        if self
            .funcs
            .read()
            .map_err(|_| Error::Backend("kernel table lock poisoned".into()))?
            .contains_key(&probe)
        {
            return Ok(());
        }
        let more = kernels::load_attention(&self.ctx, self.arch, nrep, hd)?;
        self.funcs
            .write()
            .map_err(|_| Error::Backend("kernel table lock poisoned".into()))?
            .extend(more);
        Ok(())
    }

    /// Per-(token, KV head) attention kernels exist for head_dim 64/128 and GQA ratios 1-16.
    pub fn supports(cfg: &MuseConfig) -> Result<()> {
        let rep = cfg.n_head / cfg.n_head_kv;
        if !matches!(cfg.head_dim, 64 | 128) || !matches!(rep, 1 | 2 | 4 | 8 | 16) {
            return Err(Error::Backend(format!(
                "the CUDA attention kernels support head_dim 64 or 128 and 1, 2, 4, 8 or 16 query heads per KV head (model: {}, {rep})",
                cfg.head_dim
            )));
        }
        if cfg.n_embd % 8 != 0 || cfg.n_ff % 8 != 0 || cfg.kv_dim() % 32 != 0 {
            return Err(Error::Backend(
                "CUDA kernels need widths that are multiples of 8 (32 for KV rows)".into(),
            ));
        }
        if cfg.n_embd > 8192 {
            return Err(Error::Backend(format!(
                "the CUDA norm kernels hold a row of at most 8192 values (n_embd {})",
                cfg.n_embd
            )));
        }
        Ok(())
    }

    fn scratch(&self) -> Result<std::sync::MutexGuard<'_, Option<Scratch>>> {
        let mut g = self
            .scratch
            .lock()
            .map_err(|_| Error::Backend("scratch lock poisoned".into()))?;
        if g.is_none() {
            let s = &self.stream;
            *g = Some(Scratch {
                tokens: s.alloc_zeros(MAX_BATCH_TOKENS).map_err(dev("alloc"))?,
                pos: s.alloc_zeros(MAX_BATCH_TOKENS).map_err(dev("alloc"))?,
                seqtab: s.alloc_zeros(MAX_BATCH_TOKENS).map_err(dev("alloc"))?,
                seqtab_host: Vec::new(),
                rows: s.alloc_zeros(MAX_BATCH_TOKENS).map_err(dev("alloc"))?,
                cap: MAX_BATCH_TOKENS,
                part: s.alloc_zeros(1).map_err(dev("alloc"))?,
                xs: s.alloc_zeros(1).map_err(dev("alloc"))?,
                deq: s.alloc_zeros(1).map_err(dev("alloc"))?,
                xq: s.alloc_zeros(1).map_err(dev("alloc"))?,
                xq_sc: s.alloc_zeros(1).map_err(dev("alloc"))?,
                xq_sum: s.alloc_zeros(1).map_err(dev("alloc"))?,
                mpart: s.alloc_zeros(1).map_err(dev("alloc"))?,
                mcnt: s.alloc_zeros(1).map_err(dev("alloc"))?,
                xq_made: None,
                vpart: s.alloc_zeros(1).map_err(dev("alloc"))?,
                vcnt: s.alloc_zeros(1).map_err(dev("alloc"))?,
                amax_v: s.alloc_zeros(1).map_err(dev("alloc"))?,
                amax_i: s.alloc_zeros(1).map_err(dev("alloc"))?,
                amax_cnt: s.alloc_zeros(1).map_err(dev("alloc"))?,
                pq_q: s.alloc_zeros(1).map_err(dev("alloc"))?,
                pq_d: s.alloc_zeros(1).map_err(dev("alloc"))?,
                pq_s: s.alloc_zeros(1).map_err(dev("alloc"))?,
                w16: s.alloc_zeros(1).map_err(dev("alloc"))?,
                x16: s.alloc_zeros(1).map_err(dev("alloc"))?,
                x16max: s.alloc_zeros(1).map_err(dev("alloc"))?,
                xrun: s.alloc_zeros(1).map_err(dev("alloc"))?,
                x8: s.alloc_zeros(1).map_err(dev("alloc"))?,
                x8down: s.alloc_zeros(1).map_err(dev("alloc"))?,
                y8: s.alloc_zeros(1).map_err(dev("alloc"))?,
                inv_freq: HashMap::new(),
            });
        }
        Ok(g)
    }

    fn grow<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        buf: &mut CudaSlice<T>,
        n: usize,
    ) -> Result<()> {
        if buf.len() < n {
            *buf = self.stream.alloc_zeros(n).map_err(dev("alloc"))?;
            self.bump_epoch();
        }
        Ok(())
    }

    /// A scratch buffer was replaced or the kernel choice changed: captured graphs are stale.
    fn bump_epoch(&self) {
        self.scratch_epoch
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Changes whenever a scratch buffer is replaced by a larger one (or the kernel choice
    /// changes): a graph captured before holds the old buffer's address and must be captured
    /// again (graph.rs checks).
    pub fn scratch_epoch(&self) -> u64 {
        self.scratch_epoch.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// With profiling on, drain the stream before each operation: its events then time it with
    /// nothing queued ahead, its kernels plus the host's own launch work for it (as the steps
    /// run, an operation's time can include waits for the host to launch the ones before).
    pub fn set_profile_sync(&self, on: bool) {
        self.profile_sync
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Start (or stop, returning nothing) timing every operation with CUDA events.
    pub fn set_profiling(&self, on: bool) {
        if let Ok(mut p) = self.profile.lock() {
            *p = on.then(Vec::new);
        }
    }

    /// Time spent per operation label since profiling started: (label, calls, total ms), largest first.
    pub fn profile_report(&self) -> Result<Vec<(String, usize, f64)>> {
        self.sync()?;
        let p = self
            .profile
            .lock()
            .map_err(|_| Error::Backend("profile lock".into()))?;
        let mut agg: HashMap<String, (usize, f64)> = HashMap::new();
        for (label, a, b) in p.iter().flatten() {
            let ms = a.elapsed_ms(b).map_err(dev("event timing"))? as f64;
            let e = agg.entry(label.clone()).or_default();
            e.0 += 1;
            e.1 += ms;
        }
        let mut v: Vec<(String, usize, f64)> =
            agg.into_iter().map(|(k, (n, t))| (k, n, t)).collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        Ok(v)
    }

    /// Run `f`, timing it under `label()` when profiling.
    fn timed<T>(&self, label: impl FnOnce() -> String, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let on = self.profile.lock().map(|p| p.is_some()).unwrap_or(false);
        if !on || self.capturing.load(std::sync::atomic::Ordering::SeqCst) {
            return f();
        }
        if self.profile_sync.load(std::sync::atomic::Ordering::Relaxed) {
            self.sync()?;
        }
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let a = self.ctx.new_event(flags).map_err(dev("event"))?;
        let b = self.ctx.new_event(flags).map_err(dev("event"))?;
        a.record(&self.stream).map_err(dev("event"))?;
        let r = f()?;
        b.record(&self.stream).map_err(dev("event"))?;
        if let Ok(mut p) = self.profile.lock() {
            if let Some(v) = p.as_mut() {
                v.push((label(), a, b));
            }
        }
        Ok(r)
    }

    /// Wait for the device and report an asynchronous error.
    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(dev("synchronize"))
    }

    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// Write this token's id and position into the device batch buffers (the decoder calls it
    /// before replaying a captured graph).
    pub(crate) fn upload_batch(&self, batch: &Batch) -> Result<()> {
        let mut g = self.scratch()?;
        let s = g
            .as_mut()
            .ok_or_else(|| Error::Backend("no scratch".into()))?;
        if batch.len() > s.cap {
            return Err(Error::Input(format!(
                "micro-batch of {} exceeds the CUDA limit {}",
                batch.len(),
                s.cap
            )));
        }
        self.stream
            .memcpy_htod(&batch.tokens, &mut s.tokens)
            .map_err(dev("upload tokens"))?;
        self.stream
            .memcpy_htod(&batch.pos, &mut s.pos)
            .map_err(dev("upload positions"))?;
        Ok(())
    }

    /// Greedy token of each row of `logits`, computed on the device.
    /// Chunks of 4096 values per row, at most two per SM: a vocabulary of 202,048 takes 50
    /// blocks instead of one (one block: 79 us per token on the H200, Nsight Compute, 2026-11-29).
    pub fn argmax(&self, logits: &CudaAct, out: &mut CudaSlice<u32>) -> Result<()> {
        self.argmax_of(&logits.data, logits.rows, logits.cols, out)
    }

    /// `argmax` over the first `rows` rows of `cols` floats of `data`.
    fn argmax_of(
        &self,
        data: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        out: &mut CudaSlice<u32>,
    ) -> Result<()> {
        if data.len() < rows * cols || out.len() < rows {
            return Err(Error::Backend(format!(
                "argmax of {rows} rows of {cols} values over {} values into {} ids",
                data.len(),
                out.len()
            )));
        }
        let chunks = cols
            .div_ceil(4096)
            .clamp(1, 2 * self.sm_count.max(1) as usize);
        let cols = cols as i32;
        let mut g = self.scratch()?;
        let s = g
            .as_mut()
            .ok_or_else(|| Error::Backend("no scratch".into()))?;
        self.grow(&mut s.amax_v, chunks * rows)?;
        self.grow(&mut s.amax_i, chunks * rows)?;
        self.grow(&mut s.amax_cnt, rows)?;
        let func = self.f("argmax_rows")?;
        let mut b = self.stream.launch_builder(&func);
        b.arg(data)
            .arg(&cols)
            .arg(out)
            .arg(&mut s.amax_v)
            .arg(&mut s.amax_i)
            .arg(&mut s.amax_cnt);
        let cfg = LaunchConfig {
            grid_dim: (chunks as u32, rows as u32, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel reads rows*cols floats of `data` (checked above), writes `rows` ids to `out` and
        // chunks x rows partial results, and reads and resets one counter per row (all grown
        // above).
        unsafe { b.launch(cfg) }.map_err(dev("argmax"))?;
        Ok(())
    }

    /// Token `targets[i]`'s log-probability under row `rows[i]` of `logits` and the row's
    /// `tops[i]` most likely tokens with theirs (`RowLogprob::of`), computed on the device
    /// (`row_logprobs`): two numbers a row come back, and two an alternative.
    pub fn logprobs(
        &self,
        logits: &CudaAct,
        rows: &[usize],
        targets: &[u32],
        tops: &[usize],
    ) -> Result<Vec<RowLogprob>> {
        check_rows(logits, rows, targets.len(), "targets")?;
        check_logprob_rows(rows, targets, tops)?;
        let n = rows.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let st = &self.stream;
        let rowix: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let top: Vec<u32> = tops.iter().map(|&t| t as u32).collect();
        let stride = 2 + 2 * tops.iter().copied().max().unwrap_or(0);
        let rowix_d = st.clone_htod(&rowix).map_err(dev("upload rows"))?;
        let target_d = st.clone_htod(targets).map_err(dev("upload targets"))?;
        let top_d = st.clone_htod(&top).map_err(dev("upload counts"))?;
        let mut out = st.alloc_zeros::<f32>(stride * n).map_err(dev("alloc"))?;
        let (cols, stride_i) = (logits.cols as i32, stride as i32);
        let func = self.f("row_logprobs")?;
        let mut b = st.launch_builder(&func);
        b.arg(&logits.data)
            .arg(&cols)
            .arg(&rowix_d)
            .arg(&target_d)
            .arg(&top_d)
            .arg(&stride_i)
            .arg(&mut out);
        // SAFETY: block d reads row rowix[d] (< logits.rows, checked above) of cols floats,
        // target[d] (bounded by cols in the kernel) and top[d] (at most MAX_TOP_LOGPROBS, the
        // kernel's MAX_TOP, checked above), and writes out[stride d..stride d + 2 + 2 top[d]]
        // of the stride n floats allocated above (stride is 2 + 2 max top).
        unsafe { b.launch(per_row(n)) }.map_err(dev("row_logprobs"))?;
        let v = st
            .clone_dtoh(&out)
            .map_err(dev("download log-probabilities"))?;
        Ok(v.chunks_exact(stride)
            .map(|c| {
                let k = (c[1].to_bits() as usize).min((stride - 2) / 2);
                RowLogprob {
                    logprob: c[0],
                    top: c[2..2 + 2 * k]
                        .chunks_exact(2)
                        .map(|p| (p[0].to_bits(), p[1]))
                        .collect(),
                }
            })
            .collect())
    }

    /// One token per listed row of `logits`, chosen on the device (`RowDraw`): the rows
    /// copied to a buffer of the draw's own (`gather_rows`: the logits stay as they are, so a
    /// row can be drawn again), edited there (`logit_edits`, then a grammar's mask,
    /// `logit_allowed`), their largest values found (`argmax_rows`), then one seeded
    /// Gumbel-max draw per row (`draw_rows`); only the ids come back to the host. A row whose
    /// logits held a NaN or an infinity before its edits gets `NOT_FINITE`, no token. Top-k
    /// and top-p cut each row first (`draw_cut`, `RowDraw::cut`).
    pub fn draw(&self, logits: &CudaAct, rows: &[usize], draws: &[RowDraw]) -> Result<Vec<u32>> {
        Ok(self.draw_with(logits, rows, draws, false)?.0)
    }

    /// As `draw`, with the cut each draw made (`Cut::ALL` where none): for tests of `draw_cut`
    /// against `RowDraw::cut`.
    pub fn draw_cuts(
        &self,
        logits: &CudaAct,
        rows: &[usize],
        draws: &[RowDraw],
    ) -> Result<(Vec<u32>, Vec<Cut>)> {
        self.draw_with(logits, rows, draws, true)
    }

    fn draw_with(
        &self,
        logits: &CudaAct,
        rows: &[usize],
        draws: &[RowDraw],
        want_cuts: bool,
    ) -> Result<(Vec<u32>, Vec<Cut>)> {
        check_rows(logits, rows, draws.len(), "draws")?;
        let nd = draws.len();
        if nd == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        let cols = logits.cols as i32;
        let st = &self.stream;
        let rowix: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        // The draws' rows are rows 0..nd of their own buffer.
        let own: Vec<u32> = (0..nd as u32).collect();
        let mut start = Vec::with_capacity(nd + 1);
        // Where each draw's trailing run of penalties on distinct tokens begins (applied in
        // parallel; everything before it in order).
        let mut par_at = Vec::with_capacity(nd);
        let mut ed: Vec<u32> = Vec::new();
        let (mut par, mut key) = (Vec::with_capacity(2 * nd), Vec::with_capacity(2 * nd));
        // The grammar masks, each padded to the row's words (ids past a mask's end are not
        // allowed, as `RowDraw::edit`), and each draw's mask (u32::MAX: none).
        let mw = logits.cols.div_ceil(64).max(1);
        let (mut masks, mut mask_of): (Vec<u64>, Vec<u32>) = (Vec::new(), Vec::with_capacity(nd));
        for d in draws {
            start.push((ed.len() / 4) as u32);
            let mut tokens = std::collections::HashSet::new();
            let parallel = d
                .edits
                .iter()
                .rev()
                .take_while(|e| matches!(e, LogitEdit::Penalize { .. }) && tokens.insert(e.token()))
                .count();
            par_at.push((ed.len() / 4 + d.edits.len() - parallel) as u32);
            for e in &d.edits {
                let (kind, a, b) = match *e {
                    LogitEdit::Add { bias, .. } => (0u32, bias, 0.0f32),
                    LogitEdit::Mask { .. } => (1, 0.0, 0.0),
                    LogitEdit::Penalize { repeat, sub, .. } => (2, repeat, sub),
                };
                ed.extend([e.token(), kind, a.to_bits(), b.to_bits()]);
            }
            par.extend([d.inv_temperature, d.min_p]);
            key.extend([d.seed, d.counter]);
            match &d.allowed {
                Some(m) => {
                    mask_of.push((masks.len() / mw) as u32);
                    let n = m.len().min(mw);
                    masks.extend_from_slice(&m[..n]);
                    masks.resize(masks.len() + (mw - n), 0);
                }
                None => mask_of.push(u32::MAX),
            }
        }
        start.push((ed.len() / 4) as u32);
        if ed.is_empty() {
            ed.extend([0u32; 4]); // a device buffer is never empty; no draw reads it
        }
        let up = |what: &'static str| dev(what);
        let rowix_d = st.clone_htod(&rowix).map_err(up("upload draw rows"))?;
        let own_d = st.clone_htod(&own).map_err(up("upload draw rows"))?;
        let start_d = st.clone_htod(&start).map_err(up("upload edits"))?;
        let par_d = st.clone_htod(&par_at).map_err(up("upload edits"))?;
        let ed_d = st.clone_htod(&ed).map_err(up("upload edits"))?;
        let params_d = st.clone_htod(&par).map_err(up("upload draws"))?;
        let key_d = st.clone_htod(&key).map_err(up("upload draws"))?;
        let chunks = logits
            .cols
            .div_ceil(4096)
            .clamp(1, 2 * self.sm_count.max(1) as usize);
        let grid = |threads: u32| LaunchConfig {
            grid_dim: (chunks as u32, nd as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut work = st
            .alloc_zeros::<f32>(nd * logits.cols)
            .map_err(dev("alloc"))?;
        {
            let func = self.f("gather_rows")?;
            let mut b = st.launch_builder(&func);
            b.arg(&logits.data).arg(&cols).arg(&rowix_d).arg(&mut work);
            // SAFETY: reads rows rowix (< logits.rows, checked above) of cols floats; writes
            // rows 0..nd of `work`, nd x cols floats allocated above.
            unsafe { b.launch(grid(256)) }.map_err(dev("gather_rows"))?;
        }
        // Rows holding a NaN or an infinity before their edits (a mask writes -inf): the host's
        // check of a row it draws, made where the logits are.
        let mut bad = st.alloc_zeros::<u32>(nd).map_err(dev("alloc"))?;
        {
            let func = self.f("rows_not_finite")?;
            let mut b = st.launch_builder(&func);
            b.arg(&work).arg(&cols).arg(&own_d).arg(&mut bad);
            // SAFETY: reads rows 0..nd of `work` (nd x cols floats); writes only bad[0..nd],
            // allocated above.
            unsafe { b.launch(grid(256)) }.map_err(dev("rows_not_finite"))?;
        }
        {
            let func = self.f("logit_edits")?;
            let mut b = st.launch_builder(&func);
            b.arg(&mut work)
                .arg(&cols)
                .arg(&own_d)
                .arg(&start_d)
                .arg(&par_d)
                .arg(&ed_d);
            let cfg = LaunchConfig {
                grid_dim: (nd as u32, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: one block per draw edits its own row of `work` (nd rows) at token ids the
            // kernel bounds by cols; start has nd + 1 entries and par nd into ed's 4-word edits;
            // the parallel part touches distinct tokens (par_at).
            unsafe { b.launch(cfg) }.map_err(dev("logit_edits"))?;
        }
        if !masks.is_empty() {
            let mi_d = st.clone_htod(&mask_of).map_err(up("upload masks"))?;
            let masks_d = st.clone_htod(&masks).map_err(up("upload masks"))?;
            let mw_i = mw as i32;
            let func = self.f("logit_allowed")?;
            let mut b = st.launch_builder(&func);
            b.arg(&mut work)
                .arg(&cols)
                .arg(&mi_d)
                .arg(&masks_d)
                .arg(&mw_i);
            // SAFETY: row d of `work` (nd x cols) is written only by blocks (., d); mask_of[d] is
            // u32::MAX or the index of one of masks' mw-word masks (built above), and mw covers
            // cols bits.
            unsafe { b.launch(grid(256)) }.map_err(dev("logit_allowed"))?;
        }
        let mut amax = st.alloc_zeros::<u32>(nd).map_err(dev("alloc"))?;
        self.argmax_of(&work, nd, logits.cols, &mut amax)?;
        // Top-k and top-p: each drawn row's cut (`RowDraw::cut`), where some draw has one.
        let cuts = |d: &RowDraw| {
            let on = d.inv_temperature != 0.0;
            let k = if on && d.top_k < logits.cols {
                d.top_k as u32
            } else {
                0
            };
            let p = if on { d.top_p } else { 1.0 };
            (k, p)
        };
        let cut = if draws.iter().map(cuts).any(|(k, p)| k > 0 || p < 1.0) {
            let (topk, topp): (Vec<u32>, Vec<f64>) = draws.iter().map(cuts).unzip();
            let topk_d = st.clone_htod(&topk).map_err(up("upload draws"))?;
            let topp_d = st.clone_htod(&topp).map_err(up("upload draws"))?;
            let mut cut = st.alloc_zeros::<u32>(2 * nd).map_err(dev("alloc"))?;
            let func = self.f("draw_cut")?;
            let mut b = st.launch_builder(&func);
            b.arg(&work)
                .arg(&cols)
                .arg(&amax)
                .arg(&topk_d)
                .arg(&topp_d)
                .arg(&mut cut);
            // SAFETY: block d reads row d of `work` (nd x cols floats), amax[d] (an id below
            // cols, or past it for no largest, which the kernel checks), topk[d] and topp[d]
            // (nd each, uploaded above), and writes cut[2d..2d + 2] of the 2 nd allocated above.
            unsafe { b.launch(per_row(nd)) }.map_err(dev("draw_cut"))?;
            cut
        } else {
            let all: Vec<u32> = (0..nd).flat_map(|_| [Cut::ALL.key, Cut::ALL.id]).collect();
            st.clone_htod(&all).map_err(up("upload draws"))?
        };
        let mut out = st.alloc_zeros::<u32>(nd).map_err(dev("alloc"))?;
        let mut pv = st.alloc_zeros::<f64>(chunks * nd).map_err(dev("alloc"))?;
        let mut pi = st.alloc_zeros::<i32>(chunks * nd).map_err(dev("alloc"))?;
        let mut cnt = st.alloc_zeros::<u32>(nd).map_err(dev("alloc"))?;
        let func = self.f("draw_rows")?;
        let mut b = st.launch_builder(&func);
        b.arg(&work)
            .arg(&cols)
            .arg(&own_d)
            .arg(&amax)
            .arg(&params_d)
            .arg(&key_d)
            .arg(&cut)
            .arg(&bad)
            .arg(&mut out)
            .arg(&mut pv)
            .arg(&mut pi)
            .arg(&mut cnt);
        // SAFETY: reads rows 0..nd of `work` (nd x cols floats) and amax (nd ids), 2 nd params,
        // keys and cut words and nd flags; writes nd ids and chunks x nd partials, and resets the nd zeroed
        // counters it counts with.
        unsafe { b.launch(grid(1024)) }.map_err(dev("draw_rows"))?;
        let ids = st.clone_dtoh(&out).map_err(dev("download draws"))?;
        let cuts = if want_cuts {
            let cut = st.clone_dtoh(&cut).map_err(dev("download draws"))?;
            cut.chunks_exact(2)
                .map(|c| Cut {
                    key: c[0],
                    id: c[1],
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok((ids, cuts))
    }

    fn sums8(&self, x: &CudaAct, xs: &mut CudaSlice<f32>) -> Result<()> {
        let n8 = (x.rows * x.cols / 8) as i64;
        let func = self.f("sums8")?;
        let mut b = self.stream.launch_builder(&func);
        b.arg(&x.data).arg(&n8).arg(xs);
        // SAFETY: reads 8*n8 floats of x, writes n8 sums.
        unsafe { b.launch(grid1(n8 as usize, 256)) }.map_err(dev("sums8"))?;
        Ok(())
    }

    /// Whether the norms should write sums of 8 for `rows` rows: the kernels for 2..8 tokens read
    /// them; one token needs them only for formats without an `mvq_*` kernel (matmul computes
    /// them itself when they are missing).
    fn sums_wanted(&self, rows: usize) -> bool {
        rows > 1
            || !mvq_enabled()
            || self
                .one_token_sums
                .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether products of `rows` tokens (2 or more) go to the x-stationary kernels' few-token
    /// forms (`mvq_tokens`), outside the batch-invariant and parity modes.
    fn mvq_few(&self, rows: usize) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        (2..=self.mvq_tokens.load(Relaxed)).contains(&rows)
            && !self.invariant()
            && !self.cuda_parity.load(Relaxed)
    }

    /// Whether `matvec_q` computes `w` for `rows` tokens in a few-token form: `mvq_few`, and a
    /// launch of at most 256 threads a block (the few-token forms are those; wider matrices are
    /// column-split unless `MUSER_MVQ_SPLIT=0`).
    fn mvq_few_for(&self, w: &CudaMatrix, rows: usize) -> bool {
        self.mvq_few(rows)
            && Self::mvq_for(w)
            && (Self::mvq_threads(w) <= 256 || (w.cols / 256 > mvq_range_blocks() && mvq_split()))
    }

    /// Whether an x-stationary integer kernel (`mvq_*`, kernels/matvec.cu) computes `w` for one
    /// token: Q4_K and Q6_K matrices of at most 20480 columns. `MUSER_MVQ=0` turns them off.
    fn mvq_for(w: &CudaMatrix) -> bool {
        matches!(w.ty, GgmlType::Q4_K | GgmlType::Q6_K)
            && w.cols % 256 == 0
            && w.cols <= MVQ_MAX_COLS
            && mvq_enabled()
    }

    /// Threads of an x-stationary kernel's block for `w`: 8 per 256 columns, whole warps.
    fn mvq_threads(w: &CudaMatrix) -> u32 {
        ((w.cols / 256 * 8) as u32).div_ceil(32) * 32
    }

    /// Whether `w` and `w2` can share a pair launch of the x-stationary kernels (one token, or a
    /// few in their few-token forms): one shape and format, blocks of at most 256 threads (the
    /// `_pair` kernels), and rows a multiple of the kernels' step so no step straddles the two
    /// matrices.
    fn mvq_pair_for(w: &CudaMatrix, w2: &CudaMatrix) -> bool {
        Self::mvq_stackable(w) && (w.ty, w.rows, w.cols) == (w2.ty, w2.rows, w2.cols)
    }

    /// A matrix whose rows may follow another's in one launch of the x-stationary kernels (a
    /// pair or a group): blocks of at most 256 threads, rows a multiple of the kernels' step.
    fn mvq_stackable(w: &CudaMatrix) -> bool {
        Self::mvq_for(w) && Self::mvq_threads(w) <= 256 && w.rows % MVQ_R == 0
    }

    /// Whether a group of products of one token (or of a few: `mvq_few`) may go to
    /// `mvq_q4_k_group`: not the
    /// batch-invariant or parity modes, pair launches on (`MUSER_MMQ_PAIR`), groups on (unless
    /// `MUSER_MVQ_GROUP=0`), and the group below the staged forms' threshold (those launches
    /// keep their pairs), or below `MUSER_MVQ_GROUP_MAX_MB` where that is set.
    fn group_ok(&self, ws: &[&CudaMatrix], x: &CudaAct) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let bytes: usize = ws.iter().map(|w| w.data.len()).sum();
        (x.rows == 1 || self.mvq_few(x.rows))
            && !self.invariant()
            && !self.cuda_parity.load(Relaxed)
            && self.mmq_pairs.load(Relaxed)
            && mvq_group_enabled()
            && (self.mvq_stages.load(Relaxed) == 0
                || bytes < mvq_group_max_bytes().unwrap_or(self.mvq_tma_min_bytes.load(Relaxed)))
    }

    /// A matrix `mvq_q4_k_group` takes: Q4_K, x's width, at most 256 threads, rows a multiple of
    /// the kernel's step.
    fn mvq_group_member(w: &CudaMatrix, x: &CudaAct) -> bool {
        w.ty == GgmlType::Q4_K && w.cols == x.cols && Self::mvq_stackable(w)
    }

    /// y_i = W_i x for 2 to 4 Q4_K matrices of one width (`mvq_group_member`) in one launch of
    /// `mvq_q4_k_group` (kernels/matvec.cu): their rows one after another, each row's arithmetic
    /// as `mvq_q4_k` alone.
    fn matvec_q_group(
        &self,
        x: &CudaAct,
        members: &mut [(&CudaMatrix, &mut CudaAct)],
    ) -> Result<()> {
        let n = members.len();
        if !(2..=4).contains(&n) {
            return Err(Error::Backend(format!("mvq group of {n} matrices")));
        }
        let nt = x.rows;
        let cols = members[0].0.cols;
        let mut starts = [0usize; 5];
        for (i, (w, o)) in members.iter().enumerate() {
            check(o, nt, w.rows, "matmul group")?;
            if w.cols != cols || w.rows % MVQ_R != 0 {
                return Err(Error::Backend(format!(
                    "mvq group: {}x{} with {cols} columns",
                    w.rows, w.cols
                )));
            }
            starts[i + 1] = starts[i] + w.rows;
        }
        let vrows = starts[n];
        for s in starts.iter_mut().skip(n + 1) {
            *s = vrows;
        }
        let name = if self.mvq_planes.load(std::sync::atomic::Ordering::Relaxed) == 2 {
            "mvq_q4_k_group_p2"
        } else {
            "mvq_q4_k_group"
        };
        let name = mvq_few_name(name, nt)?;
        let threads = Self::mvq_threads(members[0].0);
        let f = &self.f(name)?;
        let per_sm = self.blocks_per_sm(name, f, threads, 0)?;
        let (rpb, grid) = self.mvq_wave(vrows, MVQ_R, per_sm, 1);
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let xv = x.data.slice(..nt * cols);
        let mut w = words::Words::new(&self.stream);
        for (m, _) in members.iter() {
            w.read(&m.data);
        }
        for _ in n..4 {
            w.again(n - 1);
        }
        w.read(&xv);
        for (_, o) in members.iter_mut() {
            o.xs_ok = false;
        }
        let first_y = 5; // the words of W0..W3 and x come first
        for (_, o) in members.iter_mut() {
            w.write(&mut o.data);
        }
        for _ in n..4 {
            w.again(first_y + n - 1);
        }
        w.i32(starts[1] as i32)
            .i32(starts[2] as i32)
            .i32(starts[3] as i32)
            .i32(vrows as i32)
            .i32(cols as i32)
            .i32(rpb as i32);
        // SAFETY: the words follow mvq_q4_k_group's parameters; each matrix has its rows x cols
        // Q4_K weights and each output x's nt rows of its rows (checked above, and the kernel's
        // form is the nt-token one: x holds nt rows of cols values); the segments past
        // the n matrices are empty (their starts are vrows), so their repeated pointers are never
        // used; threads cover cols / 256 column blocks (<= 256 threads, mvq_group_member); the
        // kernel reads x only after its pdl_wait.
        unsafe { self.launch_raw(f, cfg, w.vals(), self.pdl) }.map_err(dev(name))
    }

    /// Resident blocks per SM of kernel `name` at `threads` threads and `smem` bytes of dynamic
    /// shared memory (asked of the driver once, then kept).
    fn blocks_per_sm(
        &self,
        name: &'static str,
        f: &CudaFunction,
        threads: u32,
        smem: u32,
    ) -> Result<u32> {
        let mut g = self
            .waves
            .lock()
            .map_err(|_| Error::Backend("occupancy table lock poisoned".into()))?;
        if let Some(&n) = g.get(&(name, threads, smem)) {
            return Ok(n);
        }
        let n = f
            .occupancy_max_active_blocks_per_multiprocessor(threads, smem as usize, None)
            .map_err(dev("occupancy"))?
            .max(1);
        if std::env::var_os("MUSER_KERNEL_INFO").is_some() {
            let regs = f
                .get_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS,
                )
                .unwrap_or(-1);
            let local = f
                .get_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                )
                .unwrap_or(-1);
            eprintln!(
                "{name}: {threads} threads, {smem} B dynamic shared memory, {regs} registers, {local} B local, {n} blocks per SM"
            );
        }
        g.insert((name, threads, smem), n);
        Ok(n)
    }

    /// Rows per block and blocks of a one-token launch over `vrows` rows: one wave of `per_sm`
    /// resident blocks per SM, `ranges` of them per range of rows, runs of `step` rows. (Fewer,
    /// longer blocks that put fewer rows on the busiest SM were slower: docs/BENCHMARKS.md,
    /// twelfth session.)
    fn mvq_wave(&self, vrows: usize, step: usize, per_sm: u32, ranges: usize) -> (usize, u32) {
        let slots = ((per_sm * self.sm_count) as usize / ranges).max(1);
        let rpb = vrows.div_ceil(slots).div_ceil(step) * step;
        (rpb, vrows.div_ceil(rpb) as u32)
    }

    /// A column-split launch's partial sums (`parts` floats) and its `grid` row-range counters,
    /// grown in the scratch `g` holds (None when the launch is not split).
    fn split_scratch<'a>(
        &self,
        g: &'a mut Option<std::sync::MutexGuard<'_, Option<Scratch>>>,
        parts: usize,
        grid: u32,
    ) -> Result<Option<(&'a mut CudaSlice<f32>, &'a mut CudaSlice<u32>)>> {
        let Some(g) = g.as_mut() else {
            return Ok(None);
        };
        let s = g
            .as_mut()
            .ok_or_else(|| Error::Backend("no scratch".into()))?;
        self.grow(&mut s.vpart, parts)?;
        self.grow(&mut s.vcnt, grid as usize)?;
        Ok(Some((&mut s.vpart, &mut s.vcnt)))
    }

    /// Rows `t..t + nt` of x, the same rows of `out` (`w.rows` values each), and in a pair launch
    /// W2 with those rows of its output: the views a product launch of the x-stationary kernels
    /// reads and writes.
    #[allow(clippy::type_complexity)]
    fn token_rows<'a>(
        w: &CudaMatrix,
        x: &'a CudaAct,
        out: &'a mut CudaAct,
        t: usize,
        nt: usize,
        second: Option<(&'a CudaMatrix, &'a mut CudaAct)>,
    ) -> (
        CudaView<'a, f32>,
        CudaViewMut<'a, f32>,
        Option<&'a CudaMatrix>,
        Option<CudaViewMut<'a, f32>>,
    ) {
        let rows = t * w.rows..(t + nt) * w.rows;
        let (w2, y2) = match second {
            Some((w2, o2)) => (Some(w2), Some(o2.data.slice_mut(rows.clone()))),
            None => (None, None),
        };
        (
            x.data.slice(t * x.cols..(t + nt) * x.cols),
            out.data.slice_mut(rows),
            w2,
            y2,
        )
    }

    /// Tokens t..t + nt through an x-stationary kernel (nt > 1: its few-token form, each token's
    /// bits as alone; not fused, at most 256 threads a block): blocks as wide as the matrix (8
    /// threads per 256 columns), one wave of resident blocks, each taking a run of consecutive
    /// rows. With `up`, `w` is the FFN gate and the kernel writes silu(gate x) * (up x). With
    /// `second` = (W2, out2) (`mvq_pair_for`), out2 = W2 x in the same launch, the blocks' rows
    /// running over W's and then W2's (each row's bits as alone, where the launch alone takes the
    /// same kernel family). On sm_90, launches of at least `mvq_tma_min_bytes` of weights (a pair
    /// counts both) take the TMA-staged forms (`matvec_q_tma`); the rest the register forms.
    fn matvec_q(
        &self,
        w: &CudaMatrix,
        up: Option<&CudaMatrix>,
        x: &CudaAct,
        out: &mut CudaAct,
        t: usize,
        nt: usize,
        second: Option<(&CudaMatrix, &mut CudaAct)>,
    ) -> Result<()> {
        if nt > 1 && up.is_some() {
            return Err(Error::Backend(
                "mvq: the fused SwiGLU takes one token".into(),
            ));
        }
        if let Some((w2, _)) = &second
            && !Self::mvq_pair_for(w, w2)
        {
            return Err(Error::Backend(format!(
                "mvq pair: {} {}x{} with {} {}x{}",
                w.ty, w.rows, w.cols, w2.ty, w2.rows, w2.cols
            )));
        }
        // More column blocks than a range holds (32: more than 256 threads would cover), unfused
        // and alone: column ranges (`_split`, prefetching), unless `MUSER_MVQ_SPLIT=0`.
        let range_blocks = mvq_range_blocks();
        let ranges =
            if w.cols / 256 > range_blocks && up.is_none() && second.is_none() && mvq_split() {
                (w.cols / 256).div_ceil(range_blocks)
            } else {
                1
            };
        let nbs = (w.cols / 256).div_ceil(ranges);
        let threads = if ranges > 1 {
            ((nbs * 8) as u32).div_ceil(32) * 32
        } else {
            Self::mvq_threads(w)
        };
        // sm_90 and newer: the TMA-staged forms, where they exist (not fused, at most 256 threads).
        let stages = self.mvq_stages.load(std::sync::atomic::Ordering::Relaxed);
        let launch_bytes = w.data.len() * if second.is_some() { 2 } else { 1 };
        if stages > 0
            && up.is_none()
            && threads <= 256
            && launch_bytes
                >= self
                    .mvq_tma_min_bytes
                    .load(std::sync::atomic::Ordering::Relaxed)
        {
            return self.matvec_q_tma(w, x, out, (t, nt), second, (ranges, nbs, threads), stages);
        }
        let name: &'static str = match (w.ty, threads <= 256, up.is_some(), second.is_some()) {
            (GgmlType::Q4_K, true, false, false) if ranges > 1 => "mvq_q4_k_split",
            (GgmlType::Q6_K, true, false, false) if ranges > 1 => "mvq_q6_k_split",
            (GgmlType::Q4_K, true, false, true) => "mvq_q4_k_pair",
            (GgmlType::Q4_K, true, false, false) => "mvq_q4_k",
            (GgmlType::Q4_K, false, false, false) => "mvq_q4_k_wide",
            (GgmlType::Q4_K, true, true, false) => "mvq_q4_k_swiglu",
            (GgmlType::Q4_K, false, true, false) => "mvq_q4_k_swiglu_wide",
            (GgmlType::Q6_K, true, false, true) => "mvq_q6_k_pair",
            (GgmlType::Q6_K, true, false, false) => "mvq_q6_k",
            (GgmlType::Q6_K, false, false, false) => "mvq_q6_k_wide",
            (ty, ..) => {
                return Err(Error::Backend(format!(
                    "no x-stationary kernel for {ty} with {threads} threads{}{}",
                    if up.is_some() { ", fused" } else { "" },
                    if second.is_some() { ", pair" } else { "" }
                )));
            }
        };
        // `--mode fast` (or `MUSER_MVQ_PLANES=2`): the two-plane forms (not of the fused FFN).
        let name =
            if up.is_none() && self.mvq_planes.load(std::sync::atomic::Ordering::Relaxed) == 2 {
                match name {
                    "mvq_q4_k" => "mvq_q4_k_p2",
                    "mvq_q4_k_wide" => "mvq_q4_k_wide_p2",
                    "mvq_q4_k_split" => "mvq_q4_k_split_p2",
                    "mvq_q4_k_pair" => "mvq_q4_k_pair_p2",
                    "mvq_q6_k" => "mvq_q6_k_p2",
                    "mvq_q6_k_wide" => "mvq_q6_k_wide_p2",
                    "mvq_q6_k_split" => "mvq_q6_k_split_p2",
                    "mvq_q6_k_pair" => "mvq_q6_k_pair_p2",
                    other => other,
                }
            } else {
                name
            };
        let name = mvq_few_name(name, nt)?;
        // Output rows per step: MVQ_R, or MVQ_R / 2 of each matrix when fused.
        let step = if up.is_some() { MVQ_R / 2 } else { MVQ_R };
        // Rows the blocks run over: W's, then W2's in a pair launch.
        let vrows = if second.is_some() { 2 * w.rows } else { w.rows };
        let f = &self.f(name)?;
        let per_sm = self.blocks_per_sm(name, f, threads, 0)?;
        let (rpb, grid) = self.mvq_wave(vrows, step, per_sm, ranges);
        let mut g = if ranges > 1 {
            Some(self.scratch()?)
        } else {
            None
        };
        let split = self.split_scratch(&mut g, ranges * nt * w.rows, grid)?;
        let (xv, mut yv, w2, mut y2v) = Self::token_rows(w, x, out, t, nt, second);
        let (rows, cols, rpb) = (w.rows as i32, w.cols as i32, rpb as i32);
        let cfg = LaunchConfig {
            grid_dim: (grid, ranges as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // Launched programmatically (`pdl`) or the ordinary way: the kernel reads nothing an
        // earlier kernel writes before its pdl_wait (kernels/common.cuh), only the weights.
        let mut b = words::Words::new(&self.stream);
        b.read(&w.data);
        if let Some(u) = up {
            b.read(&u.data);
        }
        if let Some(w2) = w2 {
            b.read(&w2.data);
        }
        if w.ty == GgmlType::Q6_K {
            b.i64(w.nbt);
        }
        b.read(&xv).write(&mut yv);
        if let Some(y2) = y2v.as_mut() {
            b.write(y2);
        }
        b.i32(rows).i32(cols).i32(rpb);
        if let Some((part, cnt)) = split {
            b.write(part).write(cnt).i32(nbs as i32);
        }
        // SAFETY: the words follow the kernel's parameters (kernels/matvec.cu) in order; threads
        // cover cols / 256 column blocks, or nbs of them per range in a split launch (<=
        // MVQ_MAX_COLS, the kernel's static shared memory is sized for it); the kernel reads the
        // matrix (and `up` or W2, checked above or by the caller to have the same shape and
        // format) and rows t..t + nt of x, and writes rows outputs of each of those rows (of each
        // output in a pair launch; both checked by the caller); a split launch also writes
        // ranges x nt x rows partial sums and reads and resets one counter per block row (both
        // grown above).
        unsafe { self.launch_raw(f, cfg, b.vals(), self.pdl) }.map_err(dev(name))
    }

    /// `matvec_q` through the TMA-staged kernels (`mvq_*_tma`, kernels/matvec.cu): the same
    /// arithmetic, so the same bits; `split` = (column ranges, blocks per range, threads) as
    /// `matvec_q` chose them.
    fn matvec_q_tma(
        &self,
        w: &CudaMatrix,
        x: &CudaAct,
        out: &mut CudaAct,
        (t, nt): (usize, usize),
        second: Option<(&CudaMatrix, &mut CudaAct)>,
        split: (usize, usize, u32),
        stages: usize,
    ) -> Result<()> {
        let (ranges, nbs, threads) = split;
        let fast = self.mvq_planes.load(std::sync::atomic::Ordering::Relaxed) == 2;
        let q6 = match w.ty {
            GgmlType::Q4_K => false,
            GgmlType::Q6_K => true,
            ty => {
                return Err(Error::Backend(format!(
                    "no staged one-token kernel for {ty}"
                )));
            }
        };
        let name: &'static str = match (q6, ranges > 1, second.is_some(), fast) {
            (false, false, false, false) => "mvq_q4_k_tma",
            (false, true, false, false) => "mvq_q4_k_split_tma",
            (false, false, true, false) => "mvq_q4_k_pair_tma",
            (false, false, false, true) => "mvq_q4_k_tma_p2",
            (false, true, false, true) => "mvq_q4_k_split_tma_p2",
            (false, false, true, true) => "mvq_q4_k_pair_tma_p2",
            (true, false, false, false) => "mvq_q6_k_tma",
            (true, true, false, false) => "mvq_q6_k_split_tma",
            (true, false, true, false) => "mvq_q6_k_pair_tma",
            (true, false, false, true) => "mvq_q6_k_tma_p2",
            (true, true, false, true) => "mvq_q6_k_split_tma_p2",
            (true, false, true, true) => "mvq_q6_k_pair_tma_p2",
            (_, true, true, _) => {
                return Err(Error::Backend(
                    "mvq: a pair launch is never column-split".into(),
                ));
            }
        };
        let name = mvq_few_name(name, nt)?;
        // A stage: MVQ_R rows of nbs column blocks (q6_stage_row in matvec.cu for Q6_K).
        let row_bytes = if q6 {
            nbs * 208 + (2 * nbs).next_multiple_of(16) + 16
        } else {
            nbs * 144
        };
        let stride = MVQ_R * row_bytes;
        // Q4_K's staged kernel takes 4 threads per 256-column block (Q6_K's 8, as the others).
        let threads = if q6 {
            threads
        } else {
            ((nbs * 4) as u32).div_ceil(32) * 32
        };
        let stages = stages.min(MVQ_TMA_SMEM / stride).max(2);
        let smem = (stages * stride) as u32;
        let f = &self.f(name)?;
        self.raise_smem(name, f, MVQ_TMA_SMEM as u32)?;
        let per_sm = self.blocks_per_sm(name, f, threads, smem)?;
        let vrows = if second.is_some() { 2 * w.rows } else { w.rows };
        let (rpb, grid) = self.mvq_wave(vrows, MVQ_R, per_sm, ranges);
        let mut g = if ranges > 1 {
            Some(self.scratch()?)
        } else {
            None
        };
        let split = self.split_scratch(&mut g, ranges * nt * w.rows, grid)?;
        let (xv, mut yv, w2, mut y2v) = Self::token_rows(w, x, out, t, nt, second);
        let mut b = words::Words::new(&self.stream);
        // W, then W2 (W again when there is none); Q6_K's block count.
        b.read(&w.data);
        match w2 {
            Some(w2) => b.read(&w2.data),
            None => b.again(0),
        };
        if q6 {
            b.i64(w.nbt);
        }
        // x, y, then y2 (y again when there is none).
        let y_word = if q6 { 4 } else { 3 };
        b.read(&xv).write(&mut yv);
        match y2v.as_mut() {
            Some(y2) => b.write(y2),
            None => b.again(y_word),
        };
        b.i32(w.rows as i32).i32(w.cols as i32).i32(rpb as i32);
        match split {
            Some((part, cnt)) => b.write(part).write(cnt),
            // Null: read only by column-split launches.
            None => b.null().null(),
        };
        b.i32(nbs as i32).i32(stages as i32);
        let cfg = LaunchConfig {
            grid_dim: (grid, ranges as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: the kernel's parameters in order (kernels/matvec.cu MVQ_TMA4 / MVQ_TMA6), each
        // a word; threads cover nbs column blocks (<= 32, checked by matvec_q's threads <= 256);
        // it reads the matrix (and W2, of the same shape and format: checked by matvec_q), rows
        // t..t + nt of x (t + nt <= x.rows, checked by the callers), writes rows outputs of each
        // of those rows (and of out2), and a split launch ranges x nt x rows partial sums and
        // grid counters (grown above);
        // its dynamic shared memory holds `stages` stages of `stride` bytes (raised to
        // MVQ_TMA_SMEM >= smem);
        // a Q6_K matrix's buffer has the 16 bytes of padding its last d cover may read
        // (matrix_from_bytes). Launched programmatically it reads x only after pdl_wait.
        unsafe { self.launch_raw(f, cfg, b.vals(), self.pdl) }.map_err(dev(name))
    }

    /// Launch `f` with its parameters given as words (`words::Words`: each parameter's value in
    /// one word, pointers and i64 whole, i32 and f32 in the low 4 bytes). `programmatic`: with
    /// the programmatic-stream-serialization attribute, so it may start while the kernel before
    /// it in the stream finishes, and it must call `pdl_wait` (kernels/common.cuh) before reading
    /// or writing anything an earlier kernel touches; else the ordinary way.
    ///
    /// # Safety
    /// `args` must match `f`'s parameters in number, order and size, every pointer must be valid
    /// for what the kernel does with it at this grid, and a programmatic launch's kernel must
    /// honour the rule above.
    unsafe fn launch_raw(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &mut [u64],
        programmatic: bool,
    ) -> std::result::Result<(), cudarc::driver::DriverError> {
        // SAFETY: the caller's promises are launch_ex's, without a cluster.
        unsafe { self.launch_ex(f, cfg, args, programmatic, 1) }
    }

    /// `launch_raw`, with thread-block clusters of `cluster` blocks along x when it is above 1
    /// (sm_90; the grid's x a multiple of it).
    ///
    /// # Safety
    /// As `launch_raw`; with a cluster, the kernel is written for clusters of that size.
    unsafe fn launch_ex(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &mut [u64],
        programmatic: bool,
        cluster: u32,
    ) -> std::result::Result<(), cudarc::driver::DriverError> {
        use cudarc::driver::sys;
        if self.skipped(f) {
            return Ok(());
        }
        let mut params: Vec<*mut std::ffi::c_void> = args
            .iter_mut()
            .map(|v| v as *mut u64 as *mut std::ffi::c_void)
            .collect();
        // SAFETY: an all-zero CUlaunchAttribute is a valid value of the C struct (id 0, the
        // union's bytes zero); the id and the union member set next are the ones the driver
        // reads together.
        let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
        let mut n = 0;
        if programmatic {
            attrs[n].id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attrs[n].value.programmaticStreamSerializationAllowed = 1;
            n += 1;
        }
        if cluster > 1 {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attrs[n].value.clusterDim.x = cluster;
            attrs[n].value.clusterDim.y = 1;
            attrs[n].value.clusterDim.z = 1;
            n += 1;
        }
        let lc = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: n as u32,
        };
        // SAFETY: `lc` and `attrs` live across the call; `params` points at `args`, which the
        // caller vouches for; the driver copies the parameters before returning.
        unsafe {
            sys::cuLaunchKernelEx(
                &lc,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
    }

    /// Whether `f` is one of the kernels named in `MUSER_SKIP_KERNELS` (comma-separated), a
    /// measurement knob: what a kernel costs inside the replayed step is the step's time without
    /// it (docs/BENCHMARKS.md, 2026-11-30, eleventh session). Its launches are left out, so every
    /// output is wrong: for timing only, never for anything else.
    fn skipped(&self, f: &CudaFunction) -> bool {
        static SKIP: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        let names = SKIP.get_or_init(|| {
            std::env::var("MUSER_SKIP_KERNELS")
                .map(|v| {
                    v.split(',')
                        .filter(|n| !n.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        });
        names
            .iter()
            .any(|n| self.f(n).is_ok_and(|g| g.cu_function() == f.cu_function()))
    }

    /// Launch one of the small kernels that call `pdl_wait` before touching memory (`pdl_small`):
    /// programmatically when that is on, else the ordinary way.
    ///
    /// # Safety
    /// As `launch_raw`: `w` must match `f`'s parameters, every pointer valid for what the kernel
    /// does at this grid; the kernel's first memory access follows its `pdl_wait`.
    unsafe fn launch_small(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        w: &mut words::Words<'_>,
    ) -> std::result::Result<(), cudarc::driver::DriverError> {
        // SAFETY: the caller's promises are this function's.
        unsafe { self.launch_raw(f, cfg, w.vals(), self.pdl_small) }
    }

    fn matvec(
        &self,
        w: &CudaMatrix,
        x: &CudaAct,
        xs: &CudaSlice<f32>,
        out: &mut CudaAct,
        t0: usize,
        nt: usize,
    ) -> Result<()> {
        // Rows per block of 4 warps (the warps split the columns): enough blocks to fill the GPU.
        let big: u32 = match env_usize("MUSER_MV_R") {
            Some(1) => 1,
            Some(2) => 2,
            _ => 4,
        };
        let r = if w.rows >= 16384 {
            big
        } else if w.rows >= 4096 {
            big.min(2)
        } else {
            1
        };
        let name = format!(
            "mv_{}_{r}_{nt}",
            match w.ty {
                GgmlType::F32 => "f32",
                GgmlType::F16 => "f16",
                GgmlType::BF16 => "bf16",
                GgmlType::Q8_0 => "q8_0",
                GgmlType::Q4_0 => "q4_0",
                GgmlType::Q4_K => "q4_k",
                GgmlType::Q5_K => "q5_k",
                GgmlType::Q6_K => "q6_k",
                other => return Err(Error::Backend(format!("no CUDA kernel for {other}"))),
            }
        );
        let f = &self.f(&name)?;
        let xv = x.data.slice(t0 * x.cols..(t0 + nt) * x.cols);
        let xsv = xs.slice(t0 * x.cols / 8..(t0 + nt) * x.cols / 8);
        let mut yv = out.data.slice_mut(t0 * w.rows..(t0 + nt) * w.rows);
        let (rows, cols) = (w.rows as i32, w.cols as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(&w.data)
            .arg(&w.nbt)
            .arg(&xv)
            .arg(&xsv)
            .arg(&mut yv)
            .arg(&rows)
            .arg(&cols);
        let cfg = LaunchConfig {
            grid_dim: ((w.rows as u32).div_ceil(r), 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel reads the matrix (rows x cols in its device layout), nt rows of x
        // and of xs, and writes nt rows of rows outputs; all bounds were checked by the caller.
        unsafe { b.launch(cfg) }.map_err(dev(&name))?;
        Ok(())
    }

    /// Whether the tensor-core kernels (kernels/mmq.cu) compute `w` for several tokens: Q4_K and
    /// Q6_K matrices. `MUSER_MMQ=0` turns them off.
    fn mmq_for(w: &CudaMatrix) -> bool {
        matches!(w.ty, GgmlType::Q4_K | GgmlType::Q6_K) && w.cols % 256 == 0 && mmq_enabled()
    }

    /// Column ranges of a tensor-core product, from the matrix shape alone (a token's sums must
    /// not depend on the batch). With one block per multiprocessor (a 64-token launch of the
    /// staged kernels fills an SM), a launch lasts about waves x (column blocks per range + 2,
    /// the pipeline's fill): the split that makes this least, the fewest ranges on a tie (each
    /// range costs a pass over partial sums). Returns (ranges, 256-column blocks per range).
    fn mmq_split(&self, w: &CudaMatrix, per_sm: usize) -> (usize, usize) {
        self.mmq_split_blocks(w.cols, w.rows.div_ceil(64), per_sm)
    }

    /// Whether a product of `w` with `rows` tokens runs on the tensor-core kernels: batched decode
    /// and prompts (H200, 2026-11-29, staged kernels, 64 x 512 prompt tokens in micro-batches of
    /// 512: 983 tokens/s against 730 for f32 cuBLAS; `MUSER_MMQ_PROMPTS=0` keeps cuBLAS past 64
    /// tokens). In `--mode fast` the two-plane kernels (2,169 tokens/s at commit 9f63aa8
    /// against 1,833 for TF32 cuBLAS in an earlier call). Batch-invariant: always, one token
    /// included.
    fn mmq_route(&self, w: &CudaMatrix, rows: usize) -> bool {
        Self::mmq_for(w)
            && self.gemm16_route(w, rows).is_none()
            && (self.invariant()
                || (2..=MMQ_MAX_TOKENS).contains(&rows)
                || (rows > 1 && mmq_prompts()))
    }

    /// The same for a launch of `row_blocks` blocks of 64 rows over `cols` columns, `per_sm`
    /// blocks resident per multiprocessor.
    fn mmq_split_blocks(&self, cols: usize, row_blocks: usize, per_sm: usize) -> (usize, usize) {
        let nb = (cols / 256).max(1);
        let sm = self.sm_count.max(1) as usize * per_sm.max(1);
        let mut best = (usize::MAX, 1, nb);
        for want in 1..=nb.min(64) {
            let per = nb.div_ceil(want);
            let ks = nb.div_ceil(per);
            let cost = (row_blocks * ks).div_ceil(sm) * (per + 2);
            if cost < best.0 {
                best = (cost, ks, per);
            }
        }
        (best.1, best.2)
    }

    /// A tensor-core launch of `chunk` tokens: (tiles of 8 tokens per warp, threads, the block's
    /// tokens, at least `chunk.min(64)`). Tiles of 8 tokens: at most `MUSER_MMQ_NT` per warp (and
    /// at least tiles / 4: a block holds 4 warps per row group at most), as many warps per row
    /// group as that takes.
    fn mmq_tile_shape(&self, chunk: usize, two_tiles: bool) -> (usize, u32, usize) {
        let tiles = chunk.min(64).div_ceil(8);
        if two_tiles {
            // 32 rows per warp (mmq_s2_*): 2 warps across the rows, up to 4 across the
            // tokens, 1 or 2 token tiles each.
            let nt = tiles.div_ceil(4);
            let wt = tiles.div_ceil(nt);
            (nt, 64 * wt as u32, 8 * nt * wt)
        } else {
            let max_nt = self.mmq_tiles.load(std::sync::atomic::Ordering::Relaxed);
            let mut nt = tiles.min(max_nt).max(tiles.div_ceil(4));
            if nt >= 3 {
                // Kernels of 3 or 4 tiles per warp are built for 256 threads (mmq.cu MMQ_THREADS).
                nt = nt.max(tiles.div_ceil(2));
            }
            let wt = tiles.div_ceil(nt);
            (nt, 128 * wt as u32, 8 * nt * wt)
        }
    }

    /// out = W x for every row of x on the int8 tensor cores: x to digit planes (xq_planes), then
    /// launches of up to 64 tokens (mmq_*), then the column ranges added in order (mmq_reduce).
    /// With `second` = (W2, out2), a matrix of W's shape and format: out2 = W2 x in the same
    /// launches (the staged kernels' pair mode; one conversion of x, twice the blocks per launch).
    /// Each matrix keeps the column split it has alone in the batch-invariant mode (its bits do
    /// not depend on the pairing); otherwise the split suits the pair's blocks.
    fn mmq(
        &self,
        w: &CudaMatrix,
        x: &CudaAct,
        out: &mut CudaAct,
        mut second: Option<(&CudaMatrix, &mut CudaAct)>,
    ) -> Result<()> {
        let n = x.rows;
        if let Some((w2, o2)) = &second {
            if (w2.ty, w2.rows, w2.cols) != (w.ty, w.rows, w.cols)
                || o2.rows != n
                || o2.cols != w.rows
            {
                return Err(Error::Backend(format!(
                    "mmq pair: {} {}x{} with {} {}x{} (out {}x{})",
                    w.ty, w.rows, w.cols, w2.ty, w2.rows, w2.cols, o2.rows, o2.cols
                )));
            }
        }
        let staged = self.mmq_staged.load(std::sync::atomic::Ordering::Relaxed)
            && MMQ_STAGED_MAX_SMEM <= self.smem_optin;
        if !staged {
            // The one-stage kernels have no pair mode: one matrix after the other.
            if let Some((w2, o2)) = second.take() {
                self.mmq(w, x, out, None)?;
                return self.mmq(w2, x, o2, None);
            }
        }
        let mats = if second.is_some() { 2 } else { 1 };
        let runs = w.cols / 32;
        let nb = w.cols / 256;
        let mut g = self.scratch()?;
        let s = g
            .as_mut()
            .ok_or_else(|| Error::Backend("no scratch".into()))?;
        // The variant of the kernels (the same for every launch of this product): 32 rows per
        // warp (mmq_s2_*), Q4_K's scales in the weight operand (mmq_sa_*), two digit planes
        // (mmq_p2_*; the other variants and the one-stage kernels have three).
        let q6 = w.ty == GgmlType::Q6_K;
        let two_tiles = staged
            && self
                .mmq_rows_per_warp
                .load(std::sync::atomic::Ordering::Relaxed)
                == 32;
        let scale_in_a = staged
            && !two_tiles
            && !q6
            && self
                .mmq_scale_in_a
                .load(std::sync::atomic::Ordering::Relaxed);
        let planes = if staged
            && !two_tiles
            && !scale_in_a
            && self.mmq_planes.load(std::sync::atomic::Ordering::Relaxed) == 2
        {
            2
        } else {
            3
        };
        // Two planes may also run two blocks per SM (mmq_p2o_*: two stages, 128 registers) for
        // launches of 3 or 4 token tiles per warp.
        let occ2 = planes == 2 && self.mmq_occ.load(std::sync::atomic::Ordering::Relaxed) == 2;
        let per_sm = if occ2 { 2 } else { 1 };
        // Room for every token a launch reads (the pad tokens' planes are zero): launches of
        // 64 tokens (or grid layers of 64); with `MUSER_XQ_PAD_TB=1`, up to 64 tokens, the one
        // launch's block tokens (8 for up to 8 tokens: a product of 2 tokens converts 8, not 64).
        let pad = if n > 64 || !self.xq_pad_tb.load(std::sync::atomic::Ordering::Relaxed) {
            n.div_ceil(64) * 64
        } else {
            self.mmq_tile_shape(n, two_tiles).2
        };
        self.grow(&mut s.xq, runs * planes * pad * 32)?;
        self.grow(&mut s.xq_sc, nb * pad)?;
        self.grow(&mut s.xq_sum, runs * pad)?;
        // Inside a group (`MUSER_XQ_REUSE=1`), x's planes are made once (the buffers above are
        // the size they were then, so grow replaced none of them).
        let made = self
            .in_group
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| {
                let (p, _g) = x.data.device_ptr(&self.stream);
                (p, n, w.cols, planes, pad)
            });
        let again = made.is_some()
            && s.xq_made == made
            && self.xq_reuse.load(std::sync::atomic::Ordering::Relaxed);
        s.xq_made = made;
        if !again {
            let (cols, ntok, ntok_pad) = (w.cols as i32, n as i32, pad as i32);
            let np = planes as i32;
            let f = self.f("xq_planes")?;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&x.data)
                .arg(&cols)
                .arg(&ntok)
                .arg(&ntok_pad)
                .arg(&mut s.xq)
                .arg(&mut s.xq_sc)
                .arg(&mut s.xq_sum)
                .arg(&np);
            let cfg = LaunchConfig {
                grid_dim: (nb as u32, pad as u32, 1),
                block_dim: (32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: reads n rows of cols floats of x; writes planes x cols x pad plane bytes, nb x pad
            // scales and runs x pad sums, all within the buffers grown above.
            unsafe { b.launch(cfg) }.map_err(dev("xq_planes"))?;
        }
        // Two or more full 64-token layers (prompts, large mixed server steps): one launch (unless
        // `MUSER_MMQ_ZGRID=0`) covers them, a grid layer (blockIdx.z) per 64 tokens, instead of a
        // launch per 64. A remainder of fewer than 64 tokens gets a launch of its own, sized for
        // it (in a grid layer it would cost a full 64: a server step of 64 decode tokens and a
        // 30-token prompt chunk would pay for 128).
        let z_layers =
            if staged && n >= 128 && self.mmq_zgrid.load(std::sync::atomic::Ordering::Relaxed) {
                n / 64
            } else {
                1
            };
        // The column split: from the matrix shape alone in the batch-invariant mode (each
        // matrix's, paired or not), else for the launch's blocks.
        let (ks, per) = if self.invariant() {
            self.mmq_split(w, per_sm)
        } else {
            self.mmq_split_blocks(w.cols, mats * w.rows.div_ceil(64) * z_layers, per_sm)
        };
        if ks > 1 {
            self.grow(&mut s.mpart, mats * ks * n * w.rows)?;
        }
        // With `MUSER_MMQ_FUSED_SUM=1`, a split's ranges added by the last block of each (row
        // block, grid layer) in the staged kernels (mmq_split_sum: mmq_reduce's order, the same
        // bits), not by mmq_reduce launches.
        let fused_sum = staged
            && ks > 1
            && self
                .mmq_fused_sum
                .load(std::sync::atomic::Ordering::Relaxed);
        if fused_sum {
            self.grow(&mut s.mcnt, mats * w.rows.div_ceil(64) * z_layers)?;
        }
        let (rows, cols, ntok_pad, ntok_total, per_i) = (
            w.rows as i32,
            w.cols as i32,
            pad as i32,
            n as i32,
            per as i32,
        );
        let mut tok0 = 0;
        while tok0 < n {
            // A launch's tokens: the full layers of 64 in z layers, then up to 64.
            let chunk = if z_layers > 1 && tok0 == 0 {
                64 * z_layers
            } else {
                (n - tok0).min(64)
            };
            let (nt, threads, tb) = self.mmq_tile_shape(chunk, two_tiles);
            let two_per_sm = occ2 && nt >= 3;
            let stages = if two_per_sm { 2 } else { 3 };
            let smem = (stages * mmq_stage_bytes(tb, q6, planes)) as u32;
            let name = format!(
                "mmq_{}{}_{nt}",
                if two_tiles {
                    "s2_"
                } else if scale_in_a {
                    "sa_"
                } else if two_per_sm {
                    "p2o_"
                } else if planes == 2 {
                    "p2_"
                } else if staged {
                    "s_"
                } else {
                    ""
                },
                if q6 { "q6_k" } else { "q4_k" }
            );
            let f = self.f(&name)?;
            if staged {
                self.raise_smem(&name, &f, MMQ_STAGED_MAX_SMEM)?;
            }
            let (t0, nk) = (tok0 as i32, chunk as i32);
            let mut b = self.stream.launch_builder(&f);
            b.arg(&w.data);
            if q6 {
                b.arg(&w.nbt);
            }
            b.arg(&s.xq).arg(&s.xq_sc);
            if !q6 {
                b.arg(&s.xq_sum);
            }
            b.arg(&mut out.data)
                .arg(&mut s.mpart)
                .arg(&rows)
                .arg(&cols)
                .arg(&t0)
                .arg(&nk)
                .arg(&ntok_pad)
                .arg(&ntok_total)
                .arg(&per_i);
            // The pair's second matrix and output, or null (the staged kernels' last two
            // parameters).
            let null = 0u64;
            if staged {
                match &mut second {
                    Some((w2, o2)) => {
                        b.arg(&w2.data).arg(&mut o2.data);
                    }
                    None => {
                        b.arg(&null).arg(&null);
                    }
                }
                // The split's counters (mmq_split_sum), or null (mmq_reduce adds the ranges).
                if fused_sum {
                    b.arg(&mut s.mcnt);
                } else {
                    b.arg(&null);
                }
            }
            let cfg = LaunchConfig {
                grid_dim: (
                    (mats * w.rows.div_ceil(64)) as u32,
                    ks as u32,
                    chunk.div_ceil(tb) as u32,
                ),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: if staged { smem } else { 0 },
            };
            // SAFETY: reads the matrix (rows x cols, device layout), the planes, scales and sums
            // of tokens tok0..tok0 + tb x (grid layers) <= pad (64 z_layers past 64 tokens, else
            // the one launch's tb: grid layer z of the staged kernels copies tokens
            // tok0 + z tb..tok0 + (z + 1) tb, tb <= 64, into `smem` bytes of shared memory,
            // within the limit raised above);
            // writes tokens tok0..tok0 + chunk of out (n x rows, checked by the caller) or of
            // mpart (ks x n x rows, grown above); a pair also reads W2 (W's shape and format,
            // checked above) and writes out2 (n x rows, checked) or mpart's second ks x n x rows;
            // with the split's counters (fused_sum: one per row block and grid layer, grown
            // above) the last block of each also reads those partial sums back and writes out
            // (or out2) for its rows and tokens.
            unsafe { b.launch(cfg) }.map_err(dev(&name))?;
            tok0 += chunk;
        }
        if ks > 1 && !fused_sum {
            let total = (n * w.rows) as i64;
            let ks_i = ks as i32;
            let f = self.f("mmq_reduce")?;
            let outs: Vec<&mut CudaSlice<f32>> = match second {
                Some((_, o2)) => vec![&mut out.data, &mut o2.data],
                None => vec![&mut out.data],
            };
            for (m, o) in outs.into_iter().enumerate() {
                let part = s.mpart.slice(m * ks * n * w.rows..);
                let mut b = self.stream.launch_builder(&f);
                b.arg(&part).arg(&ks_i).arg(&total).arg(o);
                // SAFETY: reads ks x total partial sums of matrix m (written above), writes
                // total outputs.
                unsafe { b.launch(grid1(n * w.rows, 256)) }.map_err(dev("mmq_reduce"))?;
            }
        }
        Ok(())
    }

    /// Whether a product of `w` with `rows` tokens runs on the f16 tensor cores (`gemm16`), and
    /// in which form: Some(true) split (accurate mode), Some(false) one f16 product (`--mode
    /// fast`). Never in the batch-invariant or cuda-parity modes, never for F32 weights in the
    /// accurate mode (f32 cuBLAS keeps them exact), never for `gemm16_min` tokens or fewer.
    fn gemm16_route(&self, w: &CudaMatrix, rows: usize) -> Option<bool> {
        use std::sync::atomic::Ordering::Relaxed;
        let fast = self.fast_mode.load(Relaxed);
        // With kept f16 weights a product reads 2 bytes per weight and dequantizes nothing:
        // it overtakes the two-plane integer kernels between 32 tokens (1,273 against 1,409
        // tokens/s aggregate at 32 sequences) and 64 (2,113 against 1,654; H200, 2026-11-30).
        let min = if fast && self.fp8_weights.load(Relaxed) {
            self.gemm8_min.load(Relaxed)
        } else if fast && self.f16_weights.load(Relaxed) {
            self.gemm16_min_kept.load(Relaxed)
        } else {
            self.gemm16_min.load(Relaxed)
        };
        // `qmma` (MUSER_QMMA=1, Q4_K): the fast form from 9 tokens up.
        let min = if self.qmma_for(w, rows) {
            QMMA_MIN_TOKENS
        } else {
            min
        };
        let on = self.gemm16.load(Relaxed)
            && rows > min
            && !self.invariant()
            && !self.cuda_parity.load(Relaxed)
            && w.cols % 8 == 0
            && (fast || w.ty != GgmlType::F32);
        on.then_some(!fast)
    }

    /// Whether products of `ws` with `x` go to the FP8 tensor cores as one product of the
    /// matrices stacked (`--fp8-weights`): each would take the FP8 route alone (the fast form
    /// of `gemm16`, no `qmma`), and their joint e4m3 copy exists or is made now.
    fn joint8_route(&self, ws: &[&CudaMatrix], x: &CudaAct) -> Result<bool> {
        if !self.fp8_weights.load(std::sync::atomic::Ordering::Relaxed)
            || ws.iter().any(|w| {
                w.cols != x.cols
                    || self.gemm16_route(w, x.rows) != Some(false)
                    || self.qmma_for(w, x.rows)
            })
        {
            return Ok(false);
        }
        self.joint8_ready(ws)
    }

    /// Whether a `--mode fast` product of `w` with `rows` tokens goes to `qmma` (kernels/qmma.cu).
    fn qmma_for(&self, w: &CudaMatrix, rows: usize) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.qmma.load(Relaxed)
            && self.fast_mode.load(Relaxed)
            && w.ty == GgmlType::Q4_K
            && rows > QMMA_MIN_TOKENS
            && rows <= QMMA_MAX_TOKENS
            && w.cols % 256 == 0
    }

    /// out = W x^ 2^-B_t for `n` <= QMMA_MAX_TOKENS tokens and a Q4_K matrix (kernels/qmma.cu):
    /// `x_hi` the tokens' f16 rows (`ld` halfs apart, from x16_split), `x16max` their largest
    /// values. Blocks of 32 rows per row warp times all the tokens, steps of operands in shared
    /// memory (QmmaShape); the columns are cut into ranges, from the matrix's shape alone, so
    /// that the launch has about `wave` blocks of 128 rows per SM, and `qmma_reduce` adds them
    /// in order.
    #[allow(clippy::too_many_arguments)]
    fn qmma(
        &self,
        w: &CudaMatrix,
        x_hi: u64,
        ld: usize,
        n: usize,
        out: &mut CudaAct,
        x16max: &CudaSlice<u32>,
        part: &mut CudaSlice<f32>,
        xrun: &mut CudaSlice<u32>,
    ) -> Result<()> {
        if n == 0
            || n > QMMA_MAX_TOKENS
            || w.cols % 256 != 0
            || w.ty != GgmlType::Q4_K
            || ld < w.cols
        {
            return Err(Error::Backend(format!(
                "qmma: {n} tokens, {} columns of {:?}",
                w.cols, w.ty
            )));
        }
        let st = &self.stream;
        let runs = w.cols / 32;
        self.grow(xrun, n * runs)?;
        {
            let f = self.f("x16_runsums")?;
            let (ld_i, n_i, cols_i) = (ld as i64, n as i32, w.cols as i32);
            let mut b = st.launch_builder(&f);
            b.arg(&x_hi)
                .arg(&ld_i)
                .arg(&n_i)
                .arg(&cols_i)
                .arg(&mut *xrun);
            // SAFETY: reads n rows of cols halfs at x_hi (ld >= cols apart, the caller's x16
            // buffer), writes n x cols / 32 words of xrun (grown above).
            unsafe { b.launch(grid1(n * runs, 256)) }.map_err(dev("x16_runsums"))?;
        }
        let sh = *self
            .qmma_shape
            .lock()
            .map_err(|_| Error::Backend("qmma shape lock poisoned".into()))?;
        // Token warps (wt) of nt 8-token tiles.
        let tiles = n.div_ceil(8);
        let (wt, nt) = if tiles <= 4 {
            (1, tiles)
        } else if sh.nt8 && !sh.xreg {
            (1, 8)
        } else {
            (2, tiles.div_ceil(2))
        };
        let wr = sh.row_warps.clamp(1, 8 / wt);
        let xreg = sh.xreg && wr >= 4;
        let stages = sh.stages.clamp(2, QMMA_MAX_STAGES);
        let (rb, ntok) = (32 * wr, 8 * nt * wt);
        let xbytes = ntok * (QM_XROW + QM_XSROW);
        let smem = if xreg {
            stages * rb * QM_WROW + 2 * xbytes
        } else {
            stages * (rb * QM_WROW + xbytes)
        } + 32 * wr * wt * QM_CROW;
        if smem > QMMA_MAX_SMEM {
            return Err(Error::Backend(format!(
                "qmma: {stages} stages of {rb} rows and {ntok} tokens need {smem} bytes of shared memory"
            )));
        }
        // Column ranges from the shape alone (blocks of 128 rows counted whatever rb is), so
        // that every cut gives the same bits.
        let nb = w.cols / 256;
        let row_blocks = w.rows.div_ceil(rb);
        let want = (sh.wave * self.sm_count as usize).div_ceil(w.rows.div_ceil(128));
        let per = nb.div_ceil(want.clamp(1, nb));
        let ksplit = nb.div_ceil(per);
        if ksplit > 1 {
            self.grow(part, ksplit * n * w.rows)?;
        }
        let name = if xreg {
            format!("qmma_q4_k_x{nt}")
        } else {
            format!("qmma_q4_k_{nt}")
        };
        let f = self.f(&name)?;
        self.raise_smem(&name, &f, QMMA_MAX_SMEM as u32)?;
        let (rows_i, cols_i, ld_i, n_i) = (w.rows as i32, w.cols as i32, ld as i64, n as i32);
        let (kb_i, wr_i, stages_i) = (per as i32, wr as i32, stages as i32);
        {
            let mut b = st.launch_builder(&f);
            b.arg(&w.data)
                .arg(&rows_i)
                .arg(&cols_i)
                .arg(&x_hi)
                .arg(&ld_i)
                .arg(&*xrun)
                .arg(&n_i)
                .arg(x16max)
                .arg(&kb_i)
                .arg(&wr_i)
                .arg(&stages_i)
                .arg(&mut out.data)
                .arg(&mut *part);
            let cfg = LaunchConfig {
                grid_dim: (row_blocks as u32, ksplit as u32, 1),
                block_dim: ((32 * wr * wt) as u32, 1, 1),
                shared_mem_bytes: smem as u32,
            };
            // SAFETY: reads the matrix's rows x cols / 256 blocks (its last row for the rows a
            // last block pads), n rows of cols halfs at x_hi (ld >= cols apart), n x cols / 32
            // run sums (written above) and n words of x16max; writes n x rows floats of out
            // (checked by the caller) with one range, else ksplit x n x rows floats of part
            // (grown above). Its shared memory (`stages` stages for rb rows and ntok >= n
            // tokens, at most QMMA_MAX_SMEM, raised above) is what the kernel lays out.
            unsafe { b.launch(cfg) }.map_err(dev("qmma"))?;
        }
        if ksplit > 1 {
            let f = self.f("qmma_reduce")?;
            let ks = ksplit as i32;
            let mut b = st.launch_builder(&f);
            b.arg(&*part)
                .arg(&ks)
                .arg(&n_i)
                .arg(&rows_i)
                .arg(x16max)
                .arg(&mut out.data);
            let cfg = LaunchConfig {
                grid_dim: ((n * w.rows).div_ceil(256).clamp(1, 4096) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: reads ksplit x n x rows partials (written just above) and n words of
            // x16max; writes n x rows floats of out.
            unsafe { b.launch(cfg) }.map_err(dev("qmma_reduce"))?;
        }
        Ok(())
    }

    /// out = W x for each (W, out) of `products` on the f16 tensor cores (kernels/dequant.cu,
    /// "Products of many tokens on the f16 tensor cores"): x to f16 once (hi, and lo when
    /// `split`) after each token's power-of-two scale, then for each matrix
    /// its rows in slabs of at most GEMM16_SLAB_BYTES dequantized to f16 the same way (or its
    /// kept copy, `--f16-weights`), cublasGemmEx (f16 operands, f32 accumulation and output)
    /// with its factors on the device (`alpha16`, made at upload): C = 2^-A hi.hi, and with `split` C += 2^-(A+11)
    /// [hi lo].[lo hi] (one product over 2 cols: hi.lo + lo.hi); then each token's row times
    /// 2^-B_t (`y16_unscale`).
    fn gemm16(
        &self,
        x: &CudaAct,
        split: bool,
        products: &mut [(&CudaMatrix, &mut CudaAct)],
    ) -> Result<()> {
        let (n, cols) = (x.rows, x.cols);
        if let Some((w, _)) = products.iter().find(|(w, o)| w.cols != cols || o.rows != n) {
            return Err(Error::Backend(format!(
                "gemm16: input {n}x{cols}, matrix {}x{}",
                w.rows, w.cols
            )));
        }
        let ld = if split { 2 * cols } else { cols };
        let mut g = self.scratch()?;
        let s = g
            .as_mut()
            .ok_or_else(|| Error::Backend("no scratch".into()))?;
        self.grow(&mut s.x16, n * ld)?;
        self.grow(&mut s.x16max, n)?;
        let st = &self.stream;
        // `--fp8-weights` (fast form only): which products go to the FP8 tensor cores (their
        // e4m3 copies made now where missing), and the activations in e4m3 once for them.
        let mut use8 = Vec::with_capacity(products.len());
        for (w, _) in products.iter() {
            use8.push(!split && self.w8_ready(w)?);
        }
        if use8.iter().any(|&u| u) {
            self.grow(&mut s.x8, n * cols)?;
            self.grow(&mut s.x8down, n)?;
        }
        if use8.iter().any(|&u| u) {
            // The token maxima (x16max, which the f16 products read too) and the e4m3 rows in
            // one launch.
            self.x8_rowquant(x, &mut s.x16max, &mut s.x8, &mut s.x8down)?;
        } else {
            let f = self.f("x16_rowmax")?;
            let cols_i = cols as i32;
            let mut b = st.launch_builder(&f);
            b.arg(&x.data).arg(&cols_i).arg(&mut s.x16max);
            let cfg = LaunchConfig {
                grid_dim: (n as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: one block per token (x's n rows, at most MAX_BATCH_TOKENS) reads its cols
            // floats (a multiple of 8) and writes its word of x16max (grown to n above).
            unsafe { b.launch(cfg) }.map_err(dev("x16_rowmax"))?;
        }
        let any16 = use8.iter().any(|&u| !u);
        let (xp, _gx) = s.x16.device_ptr_mut(st);
        // Activation rows: [hi] (fast) or [lo | hi] (split), ld halfs each.
        let (x_hi, x_lo) = if split {
            (xp + 2 * cols as u64, xp)
        } else {
            (xp, 0u64)
        };
        if any16 {
            let f = self.f("x16_split")?;
            let (rows_i, cols_i, ld_i) = (n as i32, cols as i32, ld as i64);
            let mut b = st.launch_builder(&f);
            b.arg(&x.data)
                .arg(&rows_i)
                .arg(&cols_i)
                .arg(&s.x16max)
                .arg(&x_hi)
                .arg(&x_lo)
                .arg(&ld_i);
            let cfg = grid_runs8(cols, n);
            // SAFETY: reads n x cols floats of x; writes n rows of ld halfs into x16 (grown to
            // n * ld above; hi at offset cols of each row and lo at 0 when split, else hi
            // alone).
            unsafe { b.launch(cfg) }.map_err(dev("x16_split"))?;
        }
        // One conversion of x serves every product of the call (a pair's two matrices).
        for ((w, out), fp8) in products.iter_mut().zip(use8) {
            let w: &CudaMatrix = w;
            if fp8 {
                self.gemm8(w, &s.x8, &s.x8down, out)?;
                continue;
            }
            if !split && self.qmma_for(w, n) {
                self.qmma(w, x_hi, ld, n, out, &s.x16max, &mut s.mpart, &mut s.xrun)?;
                continue;
            }
            let slab = (GEMM16_SLAB_BYTES / (2 * ld)).clamp(1, w.rows);
            // `--f16-weights`: the matrix's kept f16 copy (fast: hi, `cols` halfs a row; split:
            // [hi | lo], `ld` halfs a row, the slabs' layout), made now if it has none and there
            // is room (`room_for_copy`): past that, the slabs below do the work.
            let kept = self.f16_weights.load(std::sync::atomic::Ordering::Relaxed);
            let copy = if split { &w.w16_split } else { &w.w16 };
            if kept && copy.get().is_none() && self.room_for_copy(2 * w.rows * ld) {
                if let Ok(mut full) = st.alloc_zeros::<u16>(w.rows * ld) {
                    {
                        let (fp, _gf) = full.device_ptr_mut(st);
                        let lo = if split { fp + 2 * cols as u64 } else { 0 };
                        // SAFETY: `full` holds rows x ld halfs (allocated just above); lo at
                        // offset cols of each row when split.
                        unsafe { self.w16_rows(w, 0, w.rows, fp, lo, ld) }?;
                    }
                    let _ = copy.set(full);
                }
            }
            if let (true, Some(full)) = (kept, copy.get()) {
                let (a, _g) = full.device_ptr(st);
                let (ap, _ga) = w.alpha16.device_ptr(st);
                let (op, _go) = out.data.device_ptr_mut(st);
                if split {
                    self.split_products(w.rows, n, cols, a, xp, ap, op, w.rows)?;
                } else {
                    self.gemm16_call(w.rows, n, cols, cols, a, x_hi, ap, ap + 8, op, w.rows)?;
                }
                drop(_go);
                self.y16_unscale(out, &s.x16max)?;
                continue;
            }
            self.grow(&mut s.w16, slab * ld)?;
            let (wp, _gw) = s.w16.device_ptr_mut(st);
            let (w_hi, w_lo) = if split {
                (wp, wp + 2 * cols as u64)
            } else {
                (wp, 0u64)
            };
            let (ap, _ga) = w.alpha16.device_ptr(st);
            let (op, _go) = out.data.device_ptr_mut(st);
            let mut r0 = 0usize;
            while r0 < w.rows {
                let nr = slab.min(w.rows - r0);
                // Timed apart when profiling, inside the product's own time (INNER_LABEL).
                self.timed(
                    || format!("{INNER_LABEL}gemm16 weights to f16, split {split}"),
                    || {
                        // SAFETY: w16 holds slab * ld halfs (grown above), nr <= slab rows of ld
                        // from w_hi; lo at offset cols of each row when split.
                        unsafe { self.w16_rows(w, r0, nr, w_hi, w_lo, ld) }
                    },
                )?;
                // C: from row r0 of out's first token (out is n x w.rows floats).
                let c = op + 4 * r0 as u64;
                if split {
                    self.split_products(nr, n, cols, w_hi, xp, ap, c, w.rows)?;
                } else {
                    self.timed(
                        || format!("{INNER_LABEL}gemm16 main product, split {split}"),
                        || self.gemm16_call(nr, n, cols, ld, w_hi, x_hi, ap, ap + 8, c, w.rows),
                    )?;
                }
                r0 += nr;
            }
            drop(_go);
            self.y16_unscale(out, &s.x16max)?;
        }
        Ok(())
    }

    /// The split form's two products for `m` weight rows at `w` ([hi | lo], 2 cols halfs a row)
    /// and the n tokens' rows at `x` ([lo | hi], 2 cols halfs a row), into C at `c` (ldc
    /// floats a token), with the matrix's factors at `alpha` (`alpha16`): the main product hi .
    /// hi in runs of equal length, at most `gemm16_kchunk` columns each (0: one run), each run's
    /// result added to C in f32 (beta = 1 after the first; see GEMM16_RUN_COLUMNS); then
    /// [hi lo] . [lo hi] over 2 cols, times 2^-(A+B+11), added in one run: its share of the
    /// output is about 2^-11 of the main product's, and so is the truncation that a long run
    /// adds to it.
    #[allow(clippy::too_many_arguments)]
    fn split_products(
        &self,
        m: usize,
        n: usize,
        cols: usize,
        w: u64,
        x: u64,
        alpha: u64,
        c: u64,
        ldc: usize,
    ) -> Result<()> {
        let ld = 2 * cols;
        let x_hi = x + 2 * cols as u64;
        let kc = self
            .gemm16_kchunk
            .load(std::sync::atomic::Ordering::Relaxed);
        self.timed(
            || format!("{INNER_LABEL}gemm16 main product, split true"),
            || {
                for (i, (k0, kn)) in column_runs(cols, kc).enumerate() {
                    let beta = if i == 0 { alpha + 8 } else { alpha + 12 };
                    let off = 2 * k0 as u64;
                    self.gemm16_call(m, n, kn, ld, w + off, x_hi + off, alpha, beta, c, ldc)?;
                }
                Ok(())
            },
        )?;
        self.timed(
            || format!("{INNER_LABEL}gemm16 cross product"),
            || self.gemm16_call(m, n, 2 * cols, ld, w, x, alpha + 4, alpha + 12, c, ldc),
        )
    }

    /// Whether a kept weight copy of `bytes` may be made now: not while a graph is recorded
    /// (allocation stays outside graphs), and only while a tenth of the device, at least
    /// WEIGHT_COPY_RESERVE_MIN, stays free after it (KV caches and buffers still to come).
    pub(crate) fn room_for_copy(&self, bytes: usize) -> bool {
        !self.capturing.load(std::sync::atomic::Ordering::SeqCst)
            && self.ctx.mem_get_info().is_ok_and(|(free, total)| {
                let reserve = (total / 10).max(WEIGHT_COPY_RESERVE_MIN);
                free.saturating_sub(bytes) >= reserve
            })
    }

    /// Rows r0 .. r0 + nr of `w` as f16 (kernels/dequant.cu `w16_rows`): hi at `hi + r ld`
    /// halfs for slab row r, and lo likewise at `lo` unless it is 0.
    ///
    /// # Safety
    /// `hi` (and `lo` when not 0) must address nr rows of ld halfs on this backend's device,
    /// ld >= w.cols, valid until the stream has run the kernel.
    unsafe fn w16_rows(
        &self,
        w: &CudaMatrix,
        r0: usize,
        nr: usize,
        hi: u64,
        lo: u64,
        ld: usize,
    ) -> Result<()> {
        let f = self.f("w16_rows")?;
        let (cols_i, row0, nr_i, ld_i) = (w.cols as i32, r0 as i64, nr as i32, ld as i64);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&w.data)
            .arg(&w.fmt)
            .arg(&w.nbt)
            .arg(&cols_i)
            .arg(&row0)
            .arg(&nr_i)
            .arg(&w.wmax)
            .arg(&hi)
            .arg(&lo)
            .arg(&ld_i);
        let cfg = grid_runs8(w.cols, nr);
        // SAFETY: reads rows r0..r0+nr of the matrix (within it: callers pass r0 + nr <=
        // w.rows); writes what the caller vouches for.
        unsafe { b.launch(cfg) }.map_err(dev("w16_rows"))?;
        Ok(())
    }

    /// out[t][r] *= 2^-B_t: the activations' per-token scale (`x16_split`) undone.
    fn y16_unscale(&self, out: &mut CudaAct, x16max: &CudaSlice<u32>) -> Result<()> {
        let f = self.f("y16_unscale")?;
        let (rows, width) = (out.rows as i32, out.cols as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&mut out.data).arg(&rows).arg(&width).arg(x16max);
        let cfg = LaunchConfig {
            grid_dim: (
                (out.cols as u32).div_ceil(256).clamp(1, 1024),
                (out.rows as u32).clamp(1, 65_535),
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: scales out's rows x cols floats in place, reading one word of x16max per row
        // (the caller's x16_rowmax wrote out.rows of them).
        unsafe { b.launch(cfg) }.map_err(dev("y16_unscale"))?;
        Ok(())
    }

    /// C = alpha A^T B + beta C with cublasGemmEx: A `m` rows of `k` halfs at `a` (leading
    /// dimension `ld`), B `n` rows of `k` halfs at `b` (the same `ld`), C `n` rows of floats at
    /// `c` (leading dimension `ldc`, m of each written), alpha and beta one f32 each on the
    /// device, f32 accumulation.
    #[allow(clippy::too_many_arguments)]
    fn gemm16_call(
        &self,
        m: usize,
        n: usize,
        k: usize,
        ld: usize,
        a: u64,
        b: u64,
        alpha: u64,
        beta: u64,
        c: u64,
        ldc: usize,
    ) -> Result<()> {
        use cudarc::cublas::sys::{
            cublasComputeType_t, cublasGemmAlgo_t, cublasGemmEx, cublasPointerMode_t,
            cublasSetPointerMode_v2, cublasStatus_t, cudaDataType,
        };
        let handle = *self.blas.handle();
        let to_i32 = |v: usize| {
            i32::try_from(v).map_err(|_| Error::Backend(format!("gemm16: {v} exceeds i32")))
        };
        let (mi, ni, ki, ldi, ldci) = (
            to_i32(m)?,
            to_i32(n)?,
            to_i32(k)?,
            to_i32(ld)?,
            to_i32(ldc)?,
        );
        // SAFETY: the handle is this backend's, bound to its stream. The caller guarantees A,
        // B, C, alpha and beta as documented, valid until the stream runs this product (their
        // buffers outlive the call: scratch, the matrix, the output). The pointer mode goes
        // back to host pointers for every other cuBLAS call.
        let r = unsafe {
            cublasSetPointerMode_v2(handle, cublasPointerMode_t::CUBLAS_POINTER_MODE_DEVICE);
            let r = cublasGemmEx(
                handle,
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                mi,
                ni,
                ki,
                alpha as *const std::ffi::c_void,
                a as *const std::ffi::c_void,
                cudaDataType::CUDA_R_16F,
                ldi,
                b as *const std::ffi::c_void,
                cudaDataType::CUDA_R_16F,
                ldi,
                beta as *const std::ffi::c_void,
                c as *mut std::ffi::c_void,
                cudaDataType::CUDA_R_32F,
                ldci,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
            );
            cublasSetPointerMode_v2(handle, cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST);
            r
        };
        if r != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(Error::Backend(format!("cublasGemmEx: {r:?}")));
        }
        Ok(())
    }

    fn gemm(&self, w: &CudaMatrix, x: &CudaAct, out: &mut CudaAct) -> Result<()> {
        let mut g = self.scratch()?;
        let s = g
            .as_mut()
            .ok_or_else(|| Error::Backend("no scratch".into()))?;
        let slab = DEQ_ROWS.min(w.rows);
        self.grow(&mut s.deq, slab * w.cols)?;
        let f = &self.f("dequant_rows")?;
        let mut r0 = 0;
        while r0 < w.rows {
            let nr = slab.min(w.rows - r0);
            let (cols, row0, nrows) = (w.cols as i32, r0 as i64, nr as i32);
            let mut b = self.stream.launch_builder(f);
            b.arg(&w.data)
                .arg(&w.fmt)
                .arg(&w.nbt)
                .arg(&cols)
                .arg(&row0)
                .arg(&nrows)
                .arg(&mut s.deq);
            // SAFETY: writes nr*cols floats into deq (grown to that size above).
            unsafe { b.launch(grid1(nr * w.cols, 256)) }.map_err(dev("dequant_rows"))?;
            // Y[n][r0..r0+nr] = X[n][cols] . Wslab^T (column-major view: C = op(A) op(B)).
            let cfg = GemmConfig {
                transa: cublasOperation_t::CUBLAS_OP_T,
                transb: cublasOperation_t::CUBLAS_OP_N,
                m: nr as i32,
                n: x.rows as i32,
                k: w.cols as i32,
                alpha: 1.0f32,
                lda: w.cols as i32,
                ldb: w.cols as i32,
                beta: 0.0f32,
                ldc: w.rows as i32,
            };
            let mut c = out.data.slice_mut(r0..);
            // SAFETY: A is nr x cols (dequantized slab), B is x (rows x cols), C starts at
            // column r0 of out (rows x w.rows, leading dimension w.rows): all within bounds.
            unsafe { self.blas.gemm(cfg, &s.deq, &x.data, &mut c) }.map_err(dev("cuBLAS sgemm"))?;
            r0 += nr;
        }
        Ok(())
    }

    /// Check the caches of a micro-batch and point each token at its sequence's cache
    /// (`seqtab`, uploaded when it changed; while a graph is captured the decoder has already
    /// uploaded it). Returns what the attention launch needs: the cache type, the row size and
    /// the longest context among the batch's sequences.
    fn bind_caches(
        &self,
        caches: &[&mut CudaKv],
        spec: AttnSpec,
        batch: &Batch,
        q: &CudaAct,
        k: &CudaAct,
    ) -> Result<SeqView> {
        let n = batch.len();
        check(k, n, spec.n_head_kv * spec.head_dim, "attention k")?;
        check(q, n, spec.n_head * spec.head_dim, "attention q")?;
        if n > MAX_BATCH_TOKENS {
            return Err(Error::Input(format!(
                "micro-batch of {n} exceeds the CUDA limit {MAX_BATCH_TOKENS}"
            )));
        }
        let first = caches
            .first()
            .ok_or_else(|| Error::Input("attention without a cache".into()))?;
        let mut view = SeqView {
            ty: first.ty,
            row_bytes: first.row_bytes,
            max_ctx: caches.iter().map(|c| c.n_ctx).max().unwrap_or(0),
            one_seq: false,
        };
        if let Some(c) = caches.iter().find(|c| c.ty != view.ty) {
            return Err(Error::Input(format!(
                "one micro-batch mixes KV cache types {} and {}",
                view.ty.name(),
                c.ty.name()
            )));
        }
        let table = seq_table(batch, caches)?;
        view.one_seq = table.iter().all(|&a| Some(&a) == table.first());
        if !self.capturing.load(std::sync::atomic::Ordering::SeqCst) {
            self.upload_seqtab(&table)?;
        }
        Ok(view)
    }

    /// Point the tokens of the next micro-batch at these cache tables (CudaKv::table_addr).
    /// A step's token ids, positions and per-token cache tables, to the device (what a recorded
    /// step reads).
    fn upload_step(&self, batch: &Batch, caches: &[&mut CudaKv]) -> Result<()> {
        self.upload_batch(batch)?;
        let table = seq_table(batch, caches)?;
        self.upload_seqtab(&table)
    }

    pub(crate) fn upload_seqtab(&self, table: &[u64]) -> Result<()> {
        let mut g = self.scratch()?;
        let s = g
            .as_mut()
            .ok_or_else(|| Error::Backend("no scratch".into()))?;
        if s.seqtab_host != table {
            self.stream
                .memcpy_htod(table, &mut s.seqtab)
                .map_err(dev("upload cache table"))?;
            s.seqtab_host = table.to_vec();
        }
        Ok(())
    }

    /// Whether `n` queries of one sequence go to the tensor-core prompt attention (`attn_tc`):
    /// an f16 cache, 16 or more tokens, query heads per KV head dividing 64, head_dim 64 or
    /// 128; not in the batch-invariant or cuda-parity modes; `MUSER_ATTN_TC=0` off.
    fn attn_tc_for(&self, kv: &SeqView, spec: AttnSpec, n: usize) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let nrep = spec.n_head / spec.n_head_kv.max(1);
        self.attn_tc.load(Relaxed)
            && kv.one_seq
            && kv.ty == KvType::F16
            && n >= 16
            && nrep > 0
            && 64 % nrep == 0
            && matches!(spec.head_dim, 64 | 128)
            && !self.invariant()
            && !self.cuda_parity.load(Relaxed)
    }

    /// Whether attention for a micro-batch of `n` tokens that is not one sequence's prompt
    /// chunk (attn_tc_for) goes to `attn_tcd` or `attn_tcd2` (`attn_tcd` field): f16 cache, at
    /// least `attn_tcd_from()` tokens (1: every decode step; fewer take the CUDA-core kernel's
    /// quarter-head blocks), at most 16 query heads per KV head
    /// (one row tile), not the batch-invariant or parity modes.
    fn attn_tcd_for(&self, kv: &SeqView, spec: AttnSpec, n: usize) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let nrep = spec.n_head / spec.n_head_kv.max(1);
        self.attn_tcd.load(Relaxed) > 0
            && kv.ty == KvType::F16
            && n >= attn_tcd_from()
            && (1..=16).contains(&nrep)
            && matches!(spec.head_dim, 64 | 128)
            && !self.invariant()
            && !self.cuda_parity.load(Relaxed)
    }

    /// Attention of the `n` queries from row `r0` of the micro-batch over a layer's stored keys
    /// (split-K partials, then the merge with the output gate into the same rows of `out`).
    #[allow(clippy::too_many_arguments)]
    fn attend_cached(
        &self,
        kv: &SeqView,
        spec: AttnSpec,
        r0: usize,
        n: usize,
        q: &CudaAct,
        gate: Option<&CudaAct>,
        out: &mut CudaAct,
    ) -> Result<()> {
        let nrep = spec.n_head / spec.n_head_kv;
        let st = &self.stream;
        let mut g = self.scratch()?;
        let s = g
            .as_mut()
            .ok_or_else(|| Error::Backend("no scratch".into()))?;
        // The piece's rows: q, gate and out from row r0 (n_head x head_dim floats a row), its
        // tokens' positions and cache tables from entry r0.
        let (qa, _gq) = q.data.device_ptr(st);
        let qa = row_addr::<f32>(qa, r0, q.cols);
        let (pa, _gp) = s.pos.device_ptr(st);
        let pa = row_addr::<u32>(pa, r0, 1);
        let (ta, _gt) = s.seqtab.device_ptr(st);
        let ta = row_addr::<u64>(ta, r0, 1);
        let row_bytes = kv.row_bytes as i64;
        let layer_i = spec.layer as i32;
        let n_swa = if spec.kind.is_sliding() {
            spec.n_swa as i32
        } else {
            0
        };
        let n_kv_head = spec.n_head_kv as i32;
        let tc = self.attn_tc_for(kv, spec, n);
        let n_split = if tc {
            // Prompt chunks on the tensor cores: every visible key in one split
            // (kernels/attention.cu attn_tc).
            self.grow(&mut s.part, n * spec.n_head_kv * nrep * (spec.head_dim + 2))?;
            let split = if self.fast_mode.load(std::sync::atomic::Ordering::Relaxed) {
                ""
            } else {
                "_split"
            };
            let name = format!("attn_tc_{nrep}_{}{split}", spec.head_dim);
            let n_i = n as i32;
            let func = self.f(&name)?;
            let mut b = self.stream.launch_builder(&func);
            b.arg(&qa)
                .arg(&ta)
                .arg(&layer_i)
                .arg(&row_bytes)
                .arg(&pa)
                .arg(&n_swa)
                .arg(&spec.scale)
                .arg(&n_kv_head)
                .arg(&n_i)
                .arg(&mut s.part);
            let cfg = LaunchConfig {
                grid_dim: (spec.n_head_kv as u32, n.div_ceil(64 / nrep) as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: every token of the batch reads the one cache bound for it (one_seq,
            // checked by attn_tc_for), rows of visible positions only; writes n x n_kv_head x
            // nrep partials into `part` (grown above).
            unsafe { b.launch(cfg) }.map_err(dev(&name))?;
            1
        } else {
            let max_keys = if spec.kind.is_sliding() {
                spec.n_swa.min(kv.max_ctx)
            } else {
                kv.max_ctx
            };
            // A block's four warps take 32 keys each per pass. One token (decode) splits the
            // keys finely, 32 per split, for blocks enough to fill the GPU; 8 or more tokens give
            // blocks enough by themselves, so a split takes 128 keys (every warp busy, a quarter
            // of the partials to write and merge). The batch-invariant mode keeps 32 whatever
            // the batch.
            let per_split = if self.invariant() || n < 8 { 32 } else { 128 };
            let n_split = max_keys.div_ceil(per_split).clamp(1, ATTN_MAX_SPLITS);
            // Bounded scratch for long prompts, unless the splits must not depend on the batch.
            let n_split = if self.invariant() {
                n_split
            } else {
                n_split.min((MAX_PARTS / n).max(1))
            };
            self.grow(
                &mut s.part,
                n * spec.n_head_kv * n_split * nrep * (spec.head_dim + 2),
            )?;
            // Decode (from `attn_tcd_from()` tokens of any sequences, f16 cache) on the tensor
            // cores: attn_tcd, the same splits and partials (kernels/attention.cu), a block per
            // KV head. Else, a few tokens (fewer than `MUSER_ATTN_G4_BELOW`, default 8): each
            // block takes a quarter of a KV head's query heads (`_g4`, four times the blocks, a
            // third of the registers; a head's arithmetic is the same either way, so the bits too).
            let tcd = self.attn_tcd_for(kv, spec, n);
            let groups = if !tcd && n < attn_g4_below() && nrep % 4 == 0 {
                4
            } else {
                1
            };
            let name = if tcd {
                let split = if self.fast_mode.load(std::sync::atomic::Ordering::Relaxed) {
                    ""
                } else {
                    "_split"
                };
                let v = if self.attn_tcd.load(std::sync::atomic::Ordering::Relaxed) == 2 {
                    "2"
                } else {
                    ""
                };
                format!("attn_tcd{v}_{nrep}_{}{split}", spec.head_dim)
            } else {
                format!(
                    "attn_{nrep}_{}_{}{}",
                    spec.head_dim,
                    kv.ty.name(),
                    if groups > 1 { "_g4" } else { "" }
                )
            };
            {
                let func = self.f(&name)?;
                let cfg = LaunchConfig {
                    grid_dim: ((spec.n_head_kv * groups) as u32, n_split as u32, n as u32),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                };
                // Each token reads visible rows of its own cache (seqtab holds live caches'
                // tables, bound by bind_caches for this batch; slots derive from positions checked
                // against each cache's n_ctx) and writes n x n_kv_head x n_split partials into
                // `part`. (Not at all under MUSER_SKIP_KERNELS naming it.)
                if !self.skipped(&func) {
                    let mut b = self.stream.launch_builder(&func);
                    b.arg(&qa)
                        .arg(&ta)
                        .arg(&layer_i)
                        .arg(&row_bytes)
                        .arg(&pa)
                        .arg(&n_swa)
                        .arg(&spec.scale)
                        .arg(&n_kv_head)
                        .arg(&mut s.part);
                    // SAFETY: the reads and writes above, at this grid.
                    unsafe { b.launch(cfg) }.map_err(dev(&name))?;
                }
            }
            n_split
        };
        let (ns, nr, hd) = (n_split as i32, nrep as i32, spec.head_dim as i32);
        let func = self.f("attn_combine")?;
        let gate_at = gate.map(|gt| gt.data.device_ptr(st));
        let (oa, _go) = out.data.device_ptr_mut(st);
        let mut b = words::Words::new(&self.stream);
        b.read(&s.part)
            .i32(ns)
            .i32(nr)
            .i32(hd)
            .i32(n_kv_head)
            .addr(pa)
            .i32(n_swa);
        match &gate_at {
            Some((ga, _)) => b.addr(row_addr::<f32>(*ga, r0, q.cols)),
            None => b.null(),
        };
        b.addr(row_addr::<f32>(oa, r0, q.cols));
        let cfg = LaunchConfig {
            grid_dim: (spec.n_head as u32, n as u32, 1),
            block_dim: (spec.head_dim as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: reads the partials of the non-empty splits, writes n x n_head x head_dim outputs;
        // the words follow attn_combine's parameters; it waits first.
        unsafe { self.launch_small(&func, cfg, &mut b) }.map_err(dev("attn_combine"))?;
        out.xs_ok = false;
        Ok(())
    }

    fn inv_freq(&self, s: &mut Scratch, base: f32, head_dim: usize) -> Result<()> {
        if !s.inv_freq.contains_key(&(base.to_bits(), head_dim)) {
            // The CPU's table: base^(-2j/head_dim) in f64 (cpu/ops.rs rope_table).
            let t: Vec<f64> = (0..head_dim / 2)
                .map(|j| (base as f64).powf(-2.0 * j as f64 / head_dim as f64))
                .collect();
            let d = self
                .stream
                .clone_htod(&t)
                .map_err(dev("upload rope table"))?;
            s.inv_freq.insert((base.to_bits(), head_dim), d);
        }
        Ok(())
    }
}

/// 2 if `var` is set to 2, else `otherwise`: the choices `--mode fast` makes, outside it.
fn env_two(var: &str, otherwise: usize) -> usize {
    if env_is(var, "2") { 2 } else { otherwise }
}

/// The tensor-core kernels' digit planes outside `--mode fast`: 3, or 2 with `MUSER_MMQ_PLANES=2`.
fn env_planes() -> usize {
    env_two("MUSER_MMQ_PLANES", 3)
}

/// The one-token kernels' digit planes outside `--mode fast`: 3, or 2 with `MUSER_MVQ_PLANES=2`.
/// `MUSER_MVQ_STAGES`: 0 (the register forms) or 2..=8 stages; 3 otherwise.
fn env_mvq_stages() -> usize {
    match env_usize("MUSER_MVQ_STAGES") {
        Some(0) => 0,
        Some(n) => n.clamp(2, MVQ_TMA_MAX_STAGES),
        None => 3,
    }
}

fn env_mvq_planes() -> usize {
    env_two("MUSER_MVQ_PLANES", 3)
}

/// Blocks per SM of the two-plane kernels outside `--mode fast`: 1, or 2 with `MUSER_MMQ_OCC=2`.
fn env_blocks_per_sm() -> usize {
    env_two("MUSER_MMQ_OCC", 1)
}

/// Prompts (more than 64 tokens) on the tensor-core kernels too, unless `MUSER_MMQ_PROMPTS=0`.
fn mmq_prompts() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !env_is("MUSER_MMQ_PROMPTS", "0"))
}

/// The tensor-core kernels for several tokens are on unless `MUSER_MMQ=0`.
fn mmq_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !env_is("MUSER_MMQ", "0"))
}

/// A `qmma` tuning knob from the environment (for measurements), or its default.
fn qmma_env(name: &str, default: usize) -> usize {
    env_usize(name).filter(|&v| v > 0).unwrap_or(default)
}

/// Micro-batches of fewer tokens than this run the attention kernels that take a quarter of a KV
/// head's query heads per block (`MUSER_ATTN_G4_BELOW`, default 8).
fn attn_g4_below() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| env_usize("MUSER_ATTN_G4_BELOW").unwrap_or(8))
}

/// Micro-batches of at least this many tokens take the tensor-core decode attention
/// (`attn_tcd_for`): `MUSER_ATTN_TCD_FROM`, else 1 (every step). One token a step with it (an f16
/// cache, `--mode fast`): tg128 141.8 against 139.7 tokens/s with the CUDA-core kernel's
/// quarter-head blocks (`MUSER_ATTN_TCD_FROM=8`, the default before; H200, 2026-11-30, 56feb61).
fn attn_tcd_from() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| env_usize("MUSER_ATTN_TCD_FROM").map_or(1, |n| n.max(1)))
}

/// Column-split launches of the one-token kernels for matrices wider than 8192 columns, unless
/// `MUSER_MVQ_SPLIT=0` (then one block spans the row: `mvq_*_wide`).
fn mvq_split() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !env_is("MUSER_MVQ_SPLIT", "0"))
}

/// `norm_tail`'s kernel and threads: 512 (no spills; kernels/norm.cu says what was measured),
/// or 1024 (NORM_THREADS, the form before) where `MUSER_NORM_TAIL_THREADS=1024`, for measuring.
/// Each thread holds 8192 / threads values, so a row may have up to 8 * NORM_THREADS at either.
fn norm_tail_kernel() -> (&'static str, u32) {
    static K: std::sync::OnceLock<(&'static str, u32)> = std::sync::OnceLock::new();
    *K.get_or_init(|| {
        if env_is("MUSER_NORM_TAIL_THREADS", "1024") {
            ("norm_tail_1024", NORM_THREADS)
        } else {
            ("norm_tail_512", 512)
        }
    })
}

/// The most 256-column blocks a column range of a one-token product covers: 32 (256 threads of
/// the register kernels), or `MUSER_MVQ_RANGE_BLOCKS` (1 to 32, for measuring: narrower ranges,
/// more of them; their partial sums are added in the same fixed order, so the bits change with
/// the ranges but not with timing).
fn mvq_range_blocks() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        env_usize("MUSER_MVQ_RANGE_BLOCKS")
            .filter(|n| (1..=32).contains(n))
            .unwrap_or(32)
    })
}

/// `MUSER_MVQ_GROUP_MAX_MB` (for measuring): the largest group of one-token products, in bytes of
/// weights, `mvq_q4_k_group` takes, apart from the staged forms' threshold, so that a lower
/// `MUSER_MVQ_TMA_MIN_MB` (O staged) keeps the group (the ninth session's 10 MB had lost it too).
fn mvq_group_max_bytes() -> Option<usize> {
    static N: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *N.get_or_init(|| env_usize("MUSER_MVQ_GROUP_MAX_MB").map(|mb| mb << 20))
}

/// Group launches of one token's products of one input (`mvq_q4_k_group`) unless
/// `MUSER_MVQ_GROUP=0` (then pairs).
fn mvq_group_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !env_is("MUSER_MVQ_GROUP", "0"))
}

/// The x-stationary one-token kernels are on unless `MUSER_MVQ=0`.
fn mvq_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !env_is("MUSER_MVQ", "0"))
}

fn check(a: &CudaAct, rows: usize, cols: usize, what: &str) -> Result<()> {
    if a.rows != rows || a.cols != cols {
        return Err(Error::Backend(format!(
            "{what}: shape {}x{}, expected {rows}x{cols}",
            a.rows, a.cols
        )));
    }
    Ok(())
}

/// What one attention launch needs to know about the caches of a micro-batch.
struct SeqView {
    ty: KvType,
    row_bytes: usize,
    max_ctx: usize,
    /// Every token of the micro-batch reads one cache (a prompt chunk).
    one_seq: bool,
}

/// Positions `lo..hi` of a layer as runs of consecutive slots: (first slot, first position,
/// rows). A plane (`ring` 0) is one run; a ring's positions wrap at most once (`hi - lo <= ring`).
fn slot_runs(lo: usize, hi: usize, ring: usize) -> Vec<(usize, usize, usize)> {
    let mut runs = Vec::new();
    let mut p = lo;
    while p < hi {
        let slot = if ring > 0 { p % ring } else { p };
        let n = if ring > 0 {
            (ring - slot).min(hi - p)
        } else {
            hi - p
        };
        runs.push((slot, p, n));
        p += n;
    }
    runs
}

/// Per layer, whether it is a sliding layer's ring.
fn kv_sliding(kv: &CudaKv) -> Vec<bool> {
    kv.layers.iter().map(|l| l.ring > 0).collect()
}

fn kv_code(ty: KvType) -> i32 {
    match ty {
        KvType::F32 => 0,
        KvType::F16 => 1,
        KvType::BF16 => 2,
        KvType::Q8_0 => 3,
    }
}

impl Backend for CudaBackend {
    type Matrix = CudaMatrix;
    type Vector = CudaSlice<f32>;
    type Act = CudaAct;
    type Kv = CudaKv;

    fn name(&self) -> String {
        if self.fast_mode.load(std::sync::atomic::Ordering::Relaxed) {
            let fp8 = if self.fp8_weights.load(std::sync::atomic::Ordering::Relaxed) {
                format!(
                    ", FP8 (e4m3) products of more than {} tokens",
                    self.gemm8_min.load(std::sync::atomic::Ordering::Relaxed)
                )
            } else {
                String::new()
            };
            format!(
                "cuda ({}, fast: f16 prompt products, two-plane int8 batch products, TF32 for other formats{fp8})",
                self.device_name
            )
        } else {
            format!("cuda ({})", self.device_name)
        }
    }

    /// Any sequences up to the micro-batch limit: each token finds its own cache (seqtab).
    fn max_sequences_per_batch(&self) -> usize {
        MAX_UBATCH
    }

    fn max_batch_tokens(&self) -> usize {
        MAX_BATCH_TOKENS
    }

    fn matrix(&self, file: &Arc<Gguf>, m: &Matrix) -> Result<CudaMatrix> {
        self.matrix_from_bytes(m, m.bytes(file))
    }

    fn matrix_from_bytes(&self, m: &Matrix, bytes: &[u8]) -> Result<CudaMatrix> {
        m.check_bytes(bytes)?;
        let fmt = matrix::fmt_code(m.ty)
            .ok_or_else(|| Error::Backend(format!("no CUDA layout for {}", m.ty)))?;
        if m.cols % 8 != 0 {
            return Err(Error::Backend(format!(
                "{}: {} columns, CUDA kernels need a multiple of 8",
                m.name, m.cols
            )));
        }
        let mut bytes = matrix::device_layout(m.ty, bytes);
        if m.ty == GgmlType::Q6_K {
            // The staged one-token kernels copy each row range's d in 16-byte words: the last
            // range's cover may reach 15 bytes past the matrix (kernels/matvec.cu q6_stage_row).
            bytes.resize(bytes.len() + 16, 0);
        }
        let data = self
            .stream
            .clone_htod(&bytes)
            .map_err(dev("upload weights"))?;
        let mut w = CudaMatrix {
            ty: m.ty,
            fmt,
            rows: m.rows,
            cols: m.cols,
            nbt: matrix::n_blocks(m.ty, m.rows, m.cols) as i64,
            data,
            wmax: self.stream.alloc_zeros(1).map_err(dev("alloc"))?,
            alpha16: self.stream.alloc_zeros(4).map_err(dev("alloc"))?,
            w16: std::sync::OnceLock::new(),
            w16_split: std::sync::OnceLock::new(),
            w8: std::sync::OnceLock::new(),
            w8_joint: std::sync::OnceLock::new(),
        };
        {
            let f = self.f("w16_max")?;
            let (cols, rows) = (w.cols as i32, w.rows as i64);
            let mut b = self.stream.launch_builder(&f);
            b.arg(&w.data)
                .arg(&w.fmt)
                .arg(&w.nbt)
                .arg(&cols)
                .arg(&rows)
                .arg(&mut w.wmax);
            let cfg = LaunchConfig {
                grid_dim: ((w.rows as u32).clamp(1, 4096), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: reads the rows x cols elements of the matrix just uploaded (its format's
            // layout, checked by check_bytes), writes the one word of wmax (zeroed above).
            unsafe { b.launch(cfg) }.map_err(dev("w16_max"))?;
            let f = self.f("w16_alpha")?;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&w.wmax).arg(&mut w.alpha16);
            // SAFETY: one thread reads wmax and writes the 4 floats of alpha16.
            unsafe { b.launch(grid1(1, 1)) }.map_err(dev("w16_alpha"))?;
        }
        if !Self::mvq_for(&w) {
            self.one_token_sums
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(w)
    }

    fn write(&self, a: &mut CudaAct, values: &[f32]) -> Result<()> {
        if values.len() > a.data.len() {
            return Err(Error::Backend(format!(
                "write of {} values into {}",
                values.len(),
                a.data.len()
            )));
        }
        a.xs_ok = false;
        let mut dst = a.data.slice_mut(..values.len());
        self.stream
            .memcpy_htod(values, &mut dst)
            .map_err(dev("upload activations"))
    }

    fn vector(&self, v: &[f32]) -> Result<CudaSlice<f32>> {
        self.stream.clone_htod(v).map_err(dev("upload vector"))
    }

    fn act(&self, rows: usize, cols: usize) -> Result<CudaAct> {
        Ok(CudaAct {
            rows,
            cols,
            cap: rows,
            data: self.stream.alloc_zeros(rows * cols).map_err(dev("alloc"))?,
            xs: self
                .stream
                .alloc_zeros((rows * cols / 8).max(1))
                .map_err(dev("alloc"))?,
            xs_ok: false,
        })
    }

    fn set_rows(&self, a: &mut CudaAct, rows: usize) -> Result<()> {
        if rows > a.cap {
            return Err(Error::Backend(format!(
                "activation of {} rows cannot hold {rows}",
                a.cap
            )));
        }
        a.rows = rows;
        a.xs_ok = false;
        Ok(())
    }

    fn kv_cache(&self, cfg: &MuseConfig, ty: KvType, n_ctx: usize) -> Result<CudaKv> {
        Self::supports(cfg)?;
        self.ensure_attention(cfg.n_head / cfg.n_head_kv, cfg.head_dim)?;
        let row_bytes = ty.row_bytes(cfg.kv_dim())?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for kind in &cfg.layer_kinds {
            let slots = if kind.is_sliding() {
                (cfg.n_swa + MAX_UBATCH).min(n_ctx)
            } else {
                n_ctx
            };
            let ring = if kind.is_sliding() { slots } else { 0 };
            layers.push(LayerKv {
                k: self
                    .stream
                    .alloc_zeros(slots * row_bytes)
                    .map_err(dev("KV alloc"))?,
                v: self
                    .stream
                    .alloc_zeros(slots * row_bytes)
                    .map_err(dev("KV alloc"))?,
                ring,
            });
        }
        let host: Vec<u64> = layers
            .iter()
            .flat_map(|l| {
                let (k, _) = l.k.device_ptr(&self.stream);
                let (v, _) = l.v.device_ptr(&self.stream);
                [k, v, l.ring as u64]
            })
            .collect();
        let table = self
            .stream
            .clone_htod(&host)
            .map_err(dev("upload KV table"))?;
        let table_addr = table.device_ptr(&self.stream).0;
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(CudaKv {
            id,
            ty,
            n_ctx,
            n_swa: cfg.n_swa,
            len: 0,
            high: 0,
            row_bytes,
            layers,
            table,
            table_addr,
        })
    }

    fn kv_capacity(&self, kv: &CudaKv) -> usize {
        kv.n_ctx
    }

    fn kv_len(&self, kv: &CudaKv) -> usize {
        kv.len
    }

    fn kv_set_len(&self, kv: &mut CudaKv, len: usize) {
        kv.len = len;
        kv.high = kv.high.max(len);
    }

    fn kv_can_truncate(&self, kv: &CudaKv, len: usize) -> bool {
        // Planes are indexed by position and rings by position modulo their slots: going back
        // moves only the length (later rows are written again before they are read).
        len <= kv.len
            && kv.layers.iter().all(|l| {
                l.ring == 0
                    || muser_engine::kv::ring_allows_truncate(
                        len, kv.len, kv.high, l.ring, kv.n_swa,
                    )
            })
    }

    fn kv_clear(&self, kv: &mut CudaKv) {
        kv.len = 0;
        kv.high = 0;
    }

    fn kv_can_copy(&self) -> bool {
        true
    }

    /// Plane rows `0..len`; ring rows of every position still in its slot (`q + ring >= high`),
    /// in position order, at most two runs of slots each.
    fn kv_export(&self, kv: &CudaKv) -> Result<muser_engine::state::KvImage> {
        use muser_engine::state::{KvImage, LayerImage};
        let (len, rb) = (kv.len, kv.row_bytes);
        let mut layers = Vec::with_capacity(kv.layers.len());
        for l in &kv.layers {
            let lo = if l.ring > 0 {
                kv.high.saturating_sub(l.ring).min(len)
            } else {
                0
            };
            let mut k = vec![0u8; (len - lo) * rb];
            let mut v = vec![0u8; (len - lo) * rb];
            for (slot, at, n) in slot_runs(lo, len, l.ring) {
                let (src, dst) = (
                    slot * rb..(slot + n) * rb,
                    (at - lo) * rb..(at - lo + n) * rb,
                );
                self.stream
                    .memcpy_dtoh(&l.k.slice(src.clone()), &mut k[dst.clone()])
                    .map_err(dev("KV download"))?;
                self.stream
                    .memcpy_dtoh(&l.v.slice(src), &mut v[dst])
                    .map_err(dev("KV download"))?;
            }
            layers.push(LayerImage {
                sliding: l.ring > 0,
                lo,
                k,
                v,
            });
        }
        self.stream.synchronize().map_err(dev("synchronize"))?;
        let image = KvImage {
            ty: kv.ty,
            row_bytes: rb,
            len,
            layers,
        };
        image.check(kv.ty, rb, kv.n_ctx, kv.n_swa, &kv_sliding(kv))?;
        Ok(image)
    }

    fn kv_import(&self, image: &muser_engine::state::KvImage, kv: &mut CudaKv) -> Result<()> {
        image.check(kv.ty, kv.row_bytes, kv.n_ctx, kv.n_swa, &kv_sliding(kv))?;
        kv.len = 0;
        kv.high = 0;
        let rb = kv.row_bytes;
        let mut high = image.len;
        for (l, li) in kv.layers.iter_mut().zip(&image.layers) {
            let first = if l.ring > 0 {
                let (first, _, h) = image.ring_range(li.lo, l.ring);
                high = high.max(h);
                first
            } else {
                li.lo
            };
            for (slot, at, n) in slot_runs(first, image.len, l.ring) {
                let (src, dst) = (
                    (at - li.lo) * rb..(at - li.lo + n) * rb,
                    slot * rb..(slot + n) * rb,
                );
                self.stream
                    .memcpy_htod(&li.k[src.clone()], &mut l.k.slice_mut(dst.clone()))
                    .map_err(dev("KV upload"))?;
                self.stream
                    .memcpy_htod(&li.v[src], &mut l.v.slice_mut(dst))
                    .map_err(dev("KV upload"))?;
            }
        }
        self.stream.synchronize().map_err(dev("synchronize"))?;
        kv.len = image.len;
        kv.high = high;
        Ok(())
    }

    /// Device copies on the stream (after the steps queued before): a ring whole, a plane's
    /// first `len` rows (the rows past them are written before they are read).
    fn kv_copy(&self, src: &CudaKv, dst: &mut CudaKv) -> Result<()> {
        if (
            src.ty,
            src.n_ctx,
            src.n_swa,
            src.row_bytes,
            src.layers.len(),
        ) != (
            dst.ty,
            dst.n_ctx,
            dst.n_swa,
            dst.row_bytes,
            dst.layers.len(),
        ) {
            return Err(Error::Backend(
                "a KV cache copied into one of another shape".into(),
            ));
        }
        for (s, d) in src.layers.iter().zip(dst.layers.iter_mut()) {
            if s.ring != d.ring || s.k.len() != d.k.len() || s.v.len() != d.v.len() {
                return Err(Error::Backend(
                    "a KV cache copied into one of other layers".into(),
                ));
            }
            let n = if s.ring > 0 {
                s.k.len()
            } else {
                (src.len * src.row_bytes).min(s.k.len())
            };
            if n == 0 {
                continue;
            }
            self.stream
                .memcpy_dtod(&s.k.slice(..n), &mut d.k.slice_mut(..n))
                .map_err(dev("KV copy"))?;
            self.stream
                .memcpy_dtod(&s.v.slice(..n), &mut d.v.slice_mut(..n))
                .map_err(dev("KV copy"))?;
        }
        dst.len = src.len;
        dst.high = src.high;
        Ok(())
    }

    fn read(&self, a: &CudaAct) -> Result<Vec<f32>> {
        let v = self
            .stream
            .clone_dtoh(&a.data.slice(..a.rows * a.cols))
            .map_err(dev("download"))?;
        Ok(v)
    }

    fn read_into(&self, a: &CudaAct, out: &mut Vec<f32>) -> Result<()> {
        let n = a.rows * a.cols;
        out.resize(n, 0.0);
        self.download(&a.data.slice(..n), &mut out[..])
    }

    fn read_rows_into(
        &self,
        a: &CudaAct,
        cols: usize,
        rows: &[usize],
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if cols != a.cols {
            return Err(Error::Backend(format!(
                "rows of {cols} values asked of a matrix of {}",
                a.cols
            )));
        }
        if let Some(&r) = rows.iter().find(|&&r| r >= a.rows) {
            return Err(Error::Backend(format!(
                "row {r} is outside the activation matrix ({} rows)",
                a.rows
            )));
        }
        out.resize(rows.len() * cols, 0.0);
        // One read per run of consecutive rows (each returns once its values are in `out`).
        let mut i = 0;
        while i < rows.len() {
            let mut n = 1;
            while i + n < rows.len() && rows[i + n] == rows[i] + n {
                n += 1;
            }
            let r = rows[i];
            self.download(
                &a.data.slice(r * cols..(r + n) * cols),
                &mut out[i * cols..(i + n) * cols],
            )?;
            i += n;
        }
        Ok(())
    }

    fn draws_on_device(&self) -> bool {
        true
    }

    fn row_logprobs(
        &self,
        logits: &CudaAct,
        cols: usize,
        rows: &[usize],
        targets: &[u32],
        tops: &[usize],
        out: &mut Vec<RowLogprob>,
    ) -> Result<()> {
        if cols != logits.cols {
            return Err(Error::Backend(format!(
                "log-probabilities over {cols} values asked of logits of {}",
                logits.cols
            )));
        }
        *out = self.logprobs(logits, rows, targets, tops)?;
        Ok(())
    }

    fn draw_rows(
        &self,
        logits: &mut CudaAct,
        cols: usize,
        rows: &[usize],
        draws: &[RowDraw],
        out: &mut Vec<u32>,
    ) -> Result<()> {
        if cols != logits.cols {
            return Err(Error::Backend(format!(
                "draws over {cols} values asked of logits of {}",
                logits.cols
            )));
        }
        *out = self.draw(logits, rows, draws)?;
        Ok(())
    }

    fn step_record(
        &self,
        batch: &Batch,
        caches: &mut [&mut CudaKv],
        ws_id: u64,
    ) -> Result<StepRecord> {
        let mut g = self
            .step_graphs
            .lock()
            .map_err(|_| Error::Backend("step graphs poisoned".into()))?;
        let profiling = self.profile.lock().map(|p| p.is_some()).unwrap_or(true);
        if !g.on || profiling || self.capturing.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(StepRecord::Eager);
        }
        let Some(first) = caches.first() else {
            return Ok(StepRecord::Eager);
        };
        if caches.iter().any(|c| c.ty != first.ty) {
            return Ok(StepRecord::Eager);
        }
        let key = StepKey {
            n: batch.len(),
            ws: ws_id,
            max_ctx: caches.iter().map(|c| c.n_ctx).max().unwrap_or(0),
            kv: kv_code(first.ty),
            row_bytes: first.row_bytes,
            epoch: self.scratch_epoch(),
        };
        if g.graphs.contains_key(&key) {
            g.replay = Some(key);
            return Ok(StepRecord::Replay);
        }
        if g.warm == Some(key) && !g.failed.contains(&key) {
            g.recording = Some(key);
            return Ok(StepRecord::Record);
        }
        g.warm = None;
        g.warming = Some(key);
        Ok(StepRecord::Eager)
    }

    fn step_ran(&self, ok: bool) {
        if let Ok(mut g) = self.step_graphs.lock() {
            let key = g.warming.take();
            // Only a step that ran to the end has grown every buffer its shape needs.
            if ok {
                g.warm = key;
            }
        }
    }

    fn record_begin(&self, batch: &Batch, caches: &mut [&mut CudaKv]) -> Result<()> {
        // The recorded kernels read the batch from device memory; the uploads stay outside.
        self.upload_step(batch, caches)?;
        self.sync()?;
        self.capturing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let begun = self
            .stream
            .begin_capture(
                if self
                    .capture_relaxed
                    .load(std::sync::atomic::Ordering::Relaxed)
                {
                    cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED
                } else {
                    cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
                },
            )
            .map_err(dev("begin capture"));
        if begun.is_err() {
            self.capturing
                .store(false, std::sync::atomic::Ordering::SeqCst);
        }
        begun
    }

    fn record_close(&self, ok: bool) -> Result<bool> {
        let graph = self
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
            .map_err(dev("end capture"));
        self.capturing
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let mut g = self
            .step_graphs
            .lock()
            .map_err(|_| Error::Backend("step graphs poisoned".into()))?;
        let key = g.recording.take();
        // A graph is kept only if the recorded operations succeeded and no scratch buffer was
        // replaced while recording (the graph would hold the old address).
        let (Some(key), true, Ok(Some(graph))) = (key, ok, graph) else {
            // Not again for this shape (the caller runs the step without recording).
            g.warm = None;
            if let Some(k) = key {
                g.failed.insert(k);
            }
            return Ok(false);
        };
        if self.scratch_epoch() != key.epoch {
            g.warm = None;
            return Ok(false);
        }
        if g.graphs.len() >= MAX_STEP_GRAPHS {
            g.graphs.clear();
        }
        g.graphs.insert(key, StepGraph(graph));
        g.closed = Some(key);
        Ok(true)
    }

    fn record_run(&self) -> Result<()> {
        let mut g = self
            .step_graphs
            .lock()
            .map_err(|_| Error::Backend("step graphs poisoned".into()))?;
        let key = g.closed.take();
        match key.and_then(|k| g.graphs.get(&k)) {
            Some(StepGraph(graph)) => graph.launch().map_err(dev("graph launch")),
            None => Err(Error::Backend("no recording was just kept".into())),
        }
    }

    fn record_replay(&self, batch: &Batch, caches: &mut [&mut CudaKv]) -> Result<()> {
        self.upload_step(batch, caches)?;
        let mut g = self
            .step_graphs
            .lock()
            .map_err(|_| Error::Backend("step graphs poisoned".into()))?;
        let key = g.replay.take();
        let profiled = ncu_step().is_some_and(|(n, k)| {
            n == batch.len() && {
                let c = g.replays_of.entry(n).or_insert(0);
                *c += 1;
                *c == k
            }
        });
        let graph = match key.and_then(|k| g.graphs.get(&k)) {
            Some(StepGraph(graph)) => graph,
            None => return Err(Error::Backend("no recorded step for this batch".into())),
        };
        if profiled {
            self.sync()?;
            // SAFETY: a plain driver call on this thread's current context (the backend's).
            unsafe { cudarc::driver::sys::cuProfilerStart() };
            let run = graph
                .launch()
                .map_err(dev("graph launch"))
                .and_then(|_| self.sync());
            // SAFETY: as cuProfilerStart above; stopped whatever the launch gave.
            unsafe { cudarc::driver::sys::cuProfilerStop() };
            run?;
        } else {
            graph.launch().map_err(dev("graph launch"))?;
        }
        g.replays += 1;
        Ok(())
    }

    fn begin_batch(&self, batch: &Batch) -> Result<()> {
        if self.capturing.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        self.upload_batch(batch)
    }

    fn get_rows(&self, table: &CudaMatrix, tokens: &[u32], out: &mut CudaAct) -> Result<()> {
        self.timed(
            || "get_rows".to_string(),
            || {
                check(out, tokens.len(), table.cols, "get_rows")?;
                if let Some(&t) = tokens.iter().find(|&&t| t as usize >= table.rows) {
                    return Err(Error::Input(format!(
                        "token id {t} is outside the vocabulary (size {})",
                        table.rows
                    )));
                }
                let g = self.scratch()?;
                let s = g
                    .as_ref()
                    .ok_or_else(|| Error::Backend("no scratch".into()))?;
                let cols = table.cols as i32;
                let func = self.f("get_rows")?;
                let mut b = self.stream.launch_builder(&func);
                b.arg(&table.data)
                    .arg(&table.fmt)
                    .arg(&table.nbt)
                    .arg(&cols)
                    .arg(&s.tokens)
                    .arg(&mut out.data);
                let cfg = LaunchConfig {
                    grid_dim: (
                        (table.cols as u32).div_ceil(256).min(64),
                        tokens.len() as u32,
                        1,
                    ),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: token ids were checked against the table's rows; writes tokens x cols floats.
                unsafe { b.launch(cfg) }.map_err(dev("get_rows"))?;
                out.xs_ok = false;
                Ok(())
            },
        )
    }

    fn rms_norm(
        &self,
        x: &CudaAct,
        w: Option<&CudaSlice<f32>>,
        eps: f32,
        out: &mut CudaAct,
    ) -> Result<()> {
        self.timed(
            || "rms_norm".to_string(),
            || {
                check(out, x.rows, x.cols, "rms_norm")?;
                let n = x.cols as i32;
                let with_sums = x.cols % 8 == 0 && self.sums_wanted(x.rows);
                let func = self.f("rms_norm")?;
                let mut b = words::Words::new(&self.stream);
                b.read(&x.data);
                match w {
                    Some(w) => b.read(w),
                    None => b.null(),
                };
                b.f32(eps).i32(n).write(&mut out.data);
                if with_sums {
                    b.write(&mut out.xs);
                } else {
                    b.null();
                }
                // NORM_THREADS threads hold a row of up to 8 x NORM_THREADS values in registers
                // (kernels/norm.cu; `supports` refuses wider models).
                let cfg = LaunchConfig {
                    grid_dim: (x.rows as u32, 1, 1),
                    block_dim: (NORM_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: one block per row of n <= 8 * NORM_THREADS floats; the weight (if any)
                // has n floats; the words follow rms_norm's parameters; it waits first.
                unsafe { self.launch_small(&func, cfg, &mut b) }.map_err(dev("rms_norm"))?;
                out.xs_ok = with_sums;
                Ok(())
            },
        )
    }

    fn matmul(&self, w: &CudaMatrix, x: &CudaAct, out: &mut CudaAct) -> Result<()> {
        self.timed(
            || format!("matmul {} {}x{} n={}", w.ty, w.rows, w.cols, x.rows),
            || {
                if x.cols != w.cols {
                    return Err(Error::Backend(format!(
                        "matmul: input width {}, matrix has {} columns",
                        x.cols, w.cols
                    )));
                }
                check(out, x.rows, w.rows, "matmul")?;
                out.xs_ok = false;
                if self.parity_for(w) {
                    return self.matmul_parity(w, x, out);
                }
                let invariant = self.invariant();
                if let Some(split) = self.gemm16_route(w, x.rows) {
                    return self.gemm16(x, split, &mut [(w, out)]);
                }
                if x.rows > 1 && self.mvq_few_for(w, x.rows) {
                    return self.matvec_q(w, None, x, out, 0, x.rows, None);
                }
                if self.mmq_route(w, x.rows) {
                    return self.mmq(w, x, out, None);
                }
                if x.rows > 8 && !invariant {
                    return self.gemm(w, x, out);
                }
                if x.rows == 1 && !invariant && Self::mvq_for(w) {
                    return self.matvec_q(w, None, x, out, 0, 1, None);
                }
                let needs_sums = matches!(
                    w.ty,
                    GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q4_0
                );
                let mut g = self.scratch()?;
                let s = g
                    .as_mut()
                    .ok_or_else(|| Error::Backend("no scratch".into()))?;
                let xs: &CudaSlice<f32> = if x.xs_ok || !needs_sums {
                    &x.xs
                } else {
                    self.grow(&mut s.xs, x.rows * x.cols / 8)?;
                    self.sums8(x, &mut s.xs)?;
                    &s.xs
                };
                let mut t0 = 0;
                // Batch-invariant: one token per launch, the same kernel whatever the batch.
                let widths: &[usize] = if invariant { &[1] } else { &[8, 4, 2, 1] };
                for &nt in widths {
                    while x.rows - t0 >= nt {
                        self.matvec(w, x, xs, out, t0, nt)?;
                        t0 += nt;
                    }
                }
                Ok(())
            },
        )
    }

    fn matmul_pair(
        &self,
        w1: &CudaMatrix,
        w2: &CudaMatrix,
        x: &CudaAct,
        out1: &mut CudaAct,
        out2: &mut CudaAct,
    ) -> Result<()> {
        if self.cuda_parity.load(std::sync::atomic::Ordering::Relaxed) {
            self.matmul(w1, x, out1)?;
            return self.matmul(w2, x, out2);
        }
        // One token (or a few: `mvq_few`), two matrices of one shape: a pair launch of the
        // x-stationary kernels (each row's bits as alone in the same kernel family: the staged
        // forms take launches of at least MUSER_MVQ_TMA_MIN_MB, so the FFN's gate and up as a
        // pair, not alone).
        if (x.rows == 1 || self.mvq_few(x.rows))
            && x.cols == w1.cols
            && !self.invariant()
            && Self::mvq_pair_for(w1, w2)
            && self.mmq_pairs.load(std::sync::atomic::Ordering::Relaxed)
        {
            return self.timed(
                || format!("matmul pair {} {}x{} n={}", w1.ty, w1.rows, w1.cols, x.rows),
                || {
                    check(out1, x.rows, w1.rows, "matmul pair")?;
                    check(out2, x.rows, w2.rows, "matmul pair")?;
                    out1.xs_ok = false;
                    out2.xs_ok = false;
                    self.matvec_q(w1, None, x, out1, 0, x.rows, Some((w2, out2)))
                },
            );
        }
        // Two products of many tokens on the f16 tensor cores in one form: one conversion of x.
        if let (Some(a), Some(b)) = (self.gemm16_route(w1, x.rows), self.gemm16_route(w2, x.rows))
            && a == b
        {
            return self.timed(
                || {
                    format!(
                        "matmul pair {} {}x{} + {} {}x{} n={}",
                        w1.ty, w1.rows, w1.cols, w2.ty, w2.rows, w2.cols, x.rows
                    )
                },
                || {
                    check(out1, x.rows, w1.rows, "matmul pair")?;
                    check(out2, x.rows, w2.rows, "matmul pair")?;
                    out1.xs_ok = false;
                    out2.xs_ok = false;
                    self.gemm16(x, a, &mut [(w1, out1), (w2, out2)])
                },
            );
        }
        // Two matrices of one shape and format on the tensor-core kernels: one pair launch
        // (each product's bits as alone in the batch-invariant mode), else one after the other
        // (also where they take a few-token form, which cannot pair here: `matmul` gives each
        // token its one-token bits; `mvq_few_for` reads only the format and width, w2's too).
        let pair = x.cols == w1.cols
            && (w1.ty, w1.rows, w1.cols) == (w2.ty, w2.rows, w2.cols)
            && self.mmq_route(w1, x.rows)
            && !self.mvq_few_for(w1, x.rows)
            && self.mmq_pairs.load(std::sync::atomic::Ordering::Relaxed);
        if !pair {
            self.matmul(w1, x, out1)?;
            return self.matmul(w2, x, out2);
        }
        self.timed(
            || format!("matmul pair {} {}x{} n={}", w1.ty, w1.rows, w1.cols, x.rows),
            || {
                check(out1, x.rows, w1.rows, "matmul pair")?;
                check(out2, x.rows, w2.rows, "matmul pair")?;
                out1.xs_ok = false;
                out2.xs_ok = false;
                self.mmq(w1, x, out1, Some((w2, out2)))
            },
        )
    }

    fn matmul_group(
        &self,
        ws: &[&CudaMatrix],
        x: &CudaAct,
        outs: &mut [&mut CudaAct],
    ) -> Result<()> {
        if ws.len() == outs.len() && self.joint8_route(ws, x)? {
            return self.timed(
                || {
                    let rows: Vec<String> = ws.iter().map(|w| w.rows.to_string()).collect();
                    format!(
                        "matmul group fp8 {}x{} n={}",
                        rows.join("+"),
                        x.cols,
                        x.rows
                    )
                },
                || {
                    for (w, o) in ws.iter().zip(outs.iter()) {
                        check(o, x.rows, w.rows, "matmul group")?;
                    }
                    let mut g = self.scratch()?;
                    let s = g
                        .as_mut()
                        .ok_or_else(|| Error::Backend("no scratch".into()))?;
                    let width = self.joint8(ws, x, s)?;
                    self.y8_split(&s.y8, width, outs)
                },
            );
        }
        // One token (or a few: `mvq_few`): the Q4_K members of at most 256 threads' width (the
        // x-stationary kernels) in one group launch, each row's bits as alone; the rest one by one.
        if ws.len() == outs.len() && ws.len() <= 4 && self.group_ok(ws, x) {
            let (grouped, rest): (Vec<usize>, Vec<usize>) =
                (0..ws.len()).partition(|&i| Self::mvq_group_member(ws[i], x));
            if grouped.len() >= 2 {
                let mut members = Vec::with_capacity(grouped.len());
                let mut others = Vec::with_capacity(rest.len());
                for (i, o) in outs.iter_mut().enumerate() {
                    if grouped.contains(&i) {
                        members.push((ws[i], &mut **o));
                    } else {
                        others.push((ws[i], &mut **o));
                    }
                }
                // The members' rows, for the profile's label (made only when profiling).
                let mut rows = [0usize; 4];
                for (r, (w, _)) in rows.iter_mut().zip(members.iter()) {
                    *r = w.rows;
                }
                let n = members.len();
                self.timed(
                    || {
                        let rows: Vec<String> = rows[..n].iter().map(|r| r.to_string()).collect();
                        format!(
                            "matmul group q4_k {}x{} n={}",
                            rows.join("+"),
                            x.cols,
                            x.rows
                        )
                    },
                    || self.matvec_q_group(x, &mut members),
                )?;
                for (w, o) in others {
                    self.matmul(w, x, o)?;
                }
                return Ok(());
            }
        }
        // Several tokens: by pairs (with `MUSER_XQ_REUSE=1`, x converted to the tensor-core
        // kernels' planes once).
        if let Some(s) = self.scratch()?.as_mut() {
            s.xq_made = None;
        }
        self.in_group
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let run = muser_engine::backend::matmul_by_pairs(self, ws, x, outs);
        self.in_group
            .store(false, std::sync::atomic::Ordering::Relaxed);
        run
    }

    fn head_norm(&self, x: &mut CudaAct, head_dim: usize, eps: f32, scale: f32) -> Result<()> {
        self.timed(
            || "head_norm".to_string(),
            || {
                let n_heads = (x.cols / head_dim) as i32;
                let hd = head_dim as i32;
                let func = self.f("head_norm")?;
                let mut b = self.stream.launch_builder(&func);
                b.arg(&mut x.data)
                    .arg(&n_heads)
                    .arg(&hd)
                    .arg(&eps)
                    .arg(&scale);
                let cfg = LaunchConfig {
                    grid_dim: ((n_heads as u32).div_ceil(4), x.rows as u32, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: one warp per head of head_dim floats within rows x cols.
                unsafe { b.launch(cfg) }.map_err(dev("head_norm"))?;
                x.xs_ok = false;
                Ok(())
            },
        )
    }

    fn rope(&self, x: &mut CudaAct, head_dim: usize, batch: &Batch, freq_base: f32) -> Result<()> {
        self.timed(
            || "rope".to_string(),
            || {
                check(x, batch.len(), x.cols, "rope")?;
                let mut g = self.scratch()?;
                let s = g
                    .as_mut()
                    .ok_or_else(|| Error::Backend("no scratch".into()))?;
                self.inv_freq(s, freq_base, head_dim)?;
                let table = s
                    .inv_freq
                    .get(&(freq_base.to_bits(), head_dim))
                    .ok_or_else(|| Error::Backend("rope table".into()))?;
                let n_heads = (x.cols / head_dim) as i32;
                let hd = head_dim as i32;
                let pairs = x.cols / 2;
                let func = self.f("rope_norm")?;
                let mut b = self.stream.launch_builder(&func);
                b.arg(&mut x.data)
                    .arg(&n_heads)
                    .arg(&hd)
                    .arg(&s.pos)
                    .arg(table);
                let cfg = LaunchConfig {
                    grid_dim: ((pairs as u32).div_ceil(128), x.rows as u32, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: one thread per pair of every head of every row; positions were uploaded.
                unsafe { b.launch(cfg) }.map_err(dev("rope"))?;
                x.xs_ok = false;
                Ok(())
            },
        )
    }

    fn attention(
        &self,
        caches: &mut [&mut CudaKv],
        spec: AttnSpec,
        batch: &Batch,
        q: &CudaAct,
        k: &CudaAct,
        v: &CudaAct,
        out: &mut CudaAct,
    ) -> Result<()> {
        self.attention_gated(caches, spec, batch, q, k, v, None, out)
    }

    fn attention_gated(
        &self,
        caches: &mut [&mut CudaKv],
        spec: AttnSpec,
        batch: &Batch,
        q: &CudaAct,
        k: &CudaAct,
        v: &CudaAct,
        gate: Option<&CudaAct>,
        out: &mut CudaAct,
    ) -> Result<()> {
        self.timed(
            || format!("attention {} n={}", spec.kind.name(), batch.len()),
            || {
                let kv = self.bind_caches(caches, spec, batch, q, k)?;
                let (n, kv_dim) = (batch.len(), spec.n_head_kv * spec.head_dim);
                check(v, n, kv_dim, "attention v")?;
                check_attention_rows(q, gate, out)?;
                let (row_bytes, kvd, kt) = (kv.row_bytes as i64, kv_dim as i32, kv_code(kv.ty));
                let layer_i = spec.layer as i32;
                let func = self.f("kv_store")?;
                let st = &self.stream;
                for (r0, m) in attention_pieces(n) {
                    let g = self.scratch()?;
                    let s = g
                        .as_ref()
                        .ok_or_else(|| Error::Backend("no scratch".into()))?;
                    let (ka, _gk) = k.data.device_ptr(st);
                    let (va, _gv) = v.data.device_ptr(st);
                    let (ta, _gt) = s.seqtab.device_ptr(st);
                    let (pa, _gp) = s.pos.device_ptr(st);
                    let (ka, va) = (
                        row_addr::<f32>(ka, r0, kv_dim),
                        row_addr::<f32>(va, r0, kv_dim),
                    );
                    let (ta, pa) = (row_addr::<u64>(ta, r0, 1), row_addr::<u32>(pa, r0, 1));
                    let mut b = self.stream.launch_builder(&func);
                    b.arg(&ka)
                        .arg(&va)
                        .arg(&ta)
                        .arg(&layer_i)
                        .arg(&row_bytes)
                        .arg(&pa)
                        .arg(&kvd)
                        .arg(&kt);
                    let cfg = LaunchConfig {
                        grid_dim: (m as u32, 1, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    // SAFETY: writes one K and one V row per token of the piece (rows r0 .. r0 +
                    // m of k and v, n x kv_dim floats each, checked above) into its own cache
                    // (seqtab, bound above) at slots < the layer's capacity (positions were
                    // checked against the cache's n_ctx; ring slots are pos % ring). One stream
                    // orders it after the last piece's reads and before this piece's.
                    unsafe { b.launch(cfg) }.map_err(dev("kv_store"))?;
                    drop(b);
                    drop((_gk, _gv, _gt, _gp));
                    drop(g);
                    self.attend_cached(&kv, spec, r0, m, q, gate, out)?;
                }
                Ok(())
            },
        )
    }

    fn attend(
        &self,
        caches: &mut [&mut CudaKv],
        spec: AttnSpec,
        qk: QkSpec,
        batch: &Batch,
        q: &mut CudaAct,
        k: &mut CudaAct,
        v: &CudaAct,
        gate: &CudaAct,
        out: &mut CudaAct,
    ) -> Result<()> {
        self.timed(
            || format!("qk+attention {} n={}", spec.kind.name(), batch.len()),
            || {
                let kv = self.bind_caches(caches, spec, batch, q, k)?;
                let (n, kv_dim) = (batch.len(), spec.n_head_kv * spec.head_dim);
                check(v, n, kv_dim, "attention v")?;
                check_attention_rows(q, Some(gate), out)?;
                let (nh, nkv) = (spec.n_head as i32, spec.n_head_kv as i32);
                let (row_bytes, kt) = (kv.row_bytes as i64, kv_code(kv.ty));
                let layer_i = spec.layer as i32;
                let func = self.f(&format!("qkv_prep_{}", spec.head_dim))?;
                let st = &self.stream;
                q.xs_ok = false;
                if let Some(base) = qk.rope_base {
                    let mut g = self.scratch()?;
                    let s = g
                        .as_mut()
                        .ok_or_else(|| Error::Backend("no scratch".into()))?;
                    self.inv_freq(s, base, spec.head_dim)?;
                }
                for (r0, m) in attention_pieces(n) {
                    let g = self.scratch()?;
                    let s = g
                        .as_ref()
                        .ok_or_else(|| Error::Backend("no scratch".into()))?;
                    let (qa, _gq) = q.data.device_ptr_mut(st);
                    let (ka, _gk) = k.data.device_ptr(st);
                    let (va, _gv) = v.data.device_ptr(st);
                    let (ta, _gt) = s.seqtab.device_ptr(st);
                    let (pa, _gp) = s.pos.device_ptr(st);
                    let mut b = words::Words::new(st);
                    b.addr(row_addr::<f32>(qa, r0, q.cols))
                        .addr(row_addr::<f32>(ka, r0, kv_dim))
                        .addr(row_addr::<f32>(va, r0, kv_dim))
                        .i32(nh)
                        .i32(nkv)
                        .f32(qk.eps)
                        .f32(qk.q_scale)
                        .addr(row_addr::<u32>(pa, r0, 1));
                    match qk.rope_base {
                        Some(base) => b.read(
                            s.inv_freq
                                .get(&(base.to_bits(), spec.head_dim))
                                .ok_or_else(|| Error::Backend("rope table".into()))?,
                        ),
                        None => b.null(),
                    };
                    b.addr(row_addr::<u64>(ta, r0, 1))
                        .i32(layer_i)
                        .i64(row_bytes)
                        .i32(kt);
                    let cfg = LaunchConfig {
                        grid_dim: ((spec.n_head + 2 * spec.n_head_kv) as u32, m as u32, 1),
                        block_dim: (32, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    // SAFETY: one warp per head of every token of the piece (rows r0 .. r0 + m of
                    // q, k and v, whose shapes were checked above): q rewritten in place, k and v
                    // rows stored in the token's own cache (seqtab, bound above) at slots within
                    // the layer's capacity (positions checked against the cache's n_ctx); the
                    // words follow qkv_prep's parameters; it waits first. One stream orders it
                    // after the last piece's reads and before this piece's.
                    unsafe { self.launch_small(&func, cfg, &mut b) }.map_err(dev("qkv_prep"))?;
                    drop(b);
                    drop((_gq, _gk, _gv, _gt, _gp));
                    drop(g);
                    self.attend_cached(&kv, spec, r0, m, q, Some(gate), out)?;
                }
                Ok(())
            },
        )
    }

    fn sigmoid_gate(&self, x: &mut CudaAct, g: &CudaAct) -> Result<()> {
        check(g, x.rows, x.cols, "sigmoid_gate")?;
        let n = (x.rows * x.cols) as i64;
        let cols = x.cols as i32;
        let null = 0u64;
        let func = self.f("sigmoid_gate")?;
        let mut b = self.stream.launch_builder(&func);
        b.arg(&mut x.data)
            .arg(&g.data)
            .arg(&n)
            .arg(&cols)
            .arg(&null);
        // SAFETY: elementwise over n floats of two equal-shaped buffers.
        unsafe { b.launch(grid1(n as usize, 256)) }.map_err(dev("sigmoid_gate"))?;
        x.xs_ok = false;
        Ok(())
    }

    fn ffn_swiglu(
        &self,
        w_gate: &CudaMatrix,
        w_up: &CudaMatrix,
        x: &CudaAct,
        gate: &mut CudaAct,
        up: &mut CudaAct,
        out: &mut CudaAct,
    ) -> Result<()> {
        // One token of Q4_K gate and up: one launch computes both products and the SwiGLU
        // (each product summed as the unfused kernel sums it). Off unless `set_fused_ffn(true)`
        // or `MUSER_FUSE=1`: gpu.rs's bit-for-bit comparison with the unfused path passed on the
        // H200 (2026-11-30), but it is slower than the staged gate and up pair and the swiglu
        // kernel (tg128 123.9 against 135.4 tokens/s, H200 2026-11-30, docs/BENCHMARKS.md). The
        // same on the staged kernel (the pair's rows interleaved, the SwiGLU at each block's end;
        // the same bits as the staged pair then the swiglu kernel) was slower too: 151.3/151.6
        // against 153.3/153.0 (H200 2026-12-01, thirteenth session), and was removed.
        let fuse = x.rows == 1
            && !self.invariant()
            && !self.cuda_parity.load(std::sync::atomic::Ordering::Relaxed)
            && w_gate.ty == GgmlType::Q4_K
            && w_up.ty == GgmlType::Q4_K
            && (w_gate.rows, w_gate.cols) == (w_up.rows, w_up.cols)
            && x.cols == w_gate.cols
            && Self::mvq_for(w_gate)
            && self.fused_ffn.load(std::sync::atomic::Ordering::Relaxed);
        // `--fp8-weights`, several tokens: gate and up as one FP8 product of the two stacked,
        // the SwiGLU read from its output (swiglu_fast's arithmetic).
        if x.rows > 1 && w_gate.rows == w_up.rows && self.joint8_route(&[w_gate, w_up], x)? {
            return self.timed(
                || {
                    format!(
                        "ffn gate+up fp8 {}x{} n={} + swiglu",
                        2 * w_gate.rows,
                        w_gate.cols,
                        x.rows
                    )
                },
                || {
                    check(out, x.rows, w_gate.rows, "ffn_swiglu")?;
                    let mut g = self.scratch()?;
                    let s = g
                        .as_mut()
                        .ok_or_else(|| Error::Backend("no scratch".into()))?;
                    self.joint8(&[w_gate, w_up], x, s)?;
                    let (f, rows) = (w_gate.rows as i32, x.rows as i32);
                    let func = self.f("swiglu_joint")?;
                    let mut b = self.stream.launch_builder(&func);
                    b.arg(&s.y8).arg(&mut out.data).arg(&f).arg(&rows);
                    let cfg = LaunchConfig {
                        grid_dim: (
                            (w_gate.rows as u32).div_ceil(256),
                            (x.rows as u32).clamp(1, 65_535),
                            1,
                        ),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    // SAFETY: reads x.rows x 2f floats of y8 (joint8's output), writes x.rows x f
                    // of out (checked above).
                    unsafe { b.launch(cfg) }.map_err(dev("swiglu_joint"))?;
                    out.xs_ok = false;
                    Ok(())
                },
            );
        }
        if !fuse {
            // Several tokens: gate and up in one pair launch where they qualify.
            self.matmul_pair(w_gate, w_up, x, gate, up)?;
            return self.swiglu(gate, up, out);
        }
        self.timed(
            || format!("ffn gate+up+swiglu {}x{} n=1", w_gate.rows, w_gate.cols),
            || {
                check(out, 1, w_gate.rows, "ffn_swiglu")?;
                self.matvec_q(w_gate, Some(w_up), x, out, 0, 1, None)?;
                out.xs_ok = false;
                Ok(())
            },
        )
    }

    fn swiglu(&self, gate: &CudaAct, up: &CudaAct, out: &mut CudaAct) -> Result<()> {
        self.timed(
            || "swiglu".to_string(),
            || {
                check(up, gate.rows, gate.cols, "swiglu")?;
                check(out, gate.rows, gate.cols, "swiglu")?;
                let n = (gate.rows * gate.cols) as i64;
                // `--mode fast`, several tokens: in f32 (kernels/elementwise.cu swiglu_fast).
                // One token keeps f64, the fused FFN kernel's arithmetic.
                let fast =
                    gate.rows > 1 && self.fast_mode.load(std::sync::atomic::Ordering::Relaxed);
                let func = self.f(if fast { "swiglu_fast" } else { "swiglu" })?;
                let mut b = words::Words::new(&self.stream);
                b.read(&gate.data)
                    .read(&up.data)
                    .write(&mut out.data)
                    .i64(n);
                // SAFETY: elementwise over n floats; the words follow the kernel's parameters;
                // it waits first.
                unsafe { self.launch_small(&func, grid1(n as usize, 256), &mut b) }
                    .map_err(dev("swiglu"))?;
                out.xs_ok = false;
                Ok(())
            },
        )
    }

    fn post_norm_add(
        &self,
        resid: &mut CudaAct,
        src: &CudaAct,
        w: &CudaSlice<f32>,
        eps: f32,
    ) -> Result<()> {
        check(src, resid.rows, resid.cols, "post_norm_add")?;
        let n = resid.cols as i32;
        let func = self.f("post_norm_add")?;
        let mut b = self.stream.launch_builder(&func);
        b.arg(&mut resid.data)
            .arg(&src.data)
            .arg(w)
            .arg(&eps)
            .arg(&n);
        let cfg = LaunchConfig {
            grid_dim: (resid.rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: one block per row of n floats.
        unsafe { b.launch(cfg) }.map_err(dev("post_norm_add"))?;
        resid.xs_ok = false;
        Ok(())
    }

    fn norm_tail(
        &self,
        resid: &mut CudaAct,
        src: &CudaAct,
        w_post: &CudaSlice<f32>,
        eps_post: f32,
        w_next: &CudaSlice<f32>,
        eps_next: f32,
        next: &mut CudaAct,
    ) -> Result<()> {
        self.timed(
            || "norm_tail".to_string(),
            || {
                check(src, resid.rows, resid.cols, "norm_tail")?;
                check(next, resid.rows, resid.cols, "norm_tail")?;
                let n = resid.cols as i32;
                let with_sums = resid.cols % 8 == 0 && self.sums_wanted(resid.rows);
                // `norm_tail_cluster16` or `norm_tail_cluster` (the default where it applies):
                // a row over a cluster of 16 blocks of 64 threads or 8 of 128 (kernels/norm.cu),
                // where no sums of 8 are wanted, on sm_90 and newer; else a block per row.
                let blocks = self.norm_tail_cluster();
                let cluster = self.hopper && !with_sums && resid.cols <= 8192 && blocks > 0;
                let (name, cfg, blocks) = if cluster {
                    let name = match blocks {
                        16 => "norm_tail_cluster16",
                        _ => "norm_tail_cluster",
                    };
                    let cfg = LaunchConfig {
                        grid_dim: (blocks, resid.rows as u32, 1),
                        block_dim: (1024 / blocks, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    (name, cfg, blocks)
                } else {
                    let (name, threads) = norm_tail_kernel();
                    let cfg = LaunchConfig {
                        grid_dim: (resid.rows as u32, 1, 1),
                        block_dim: (threads, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    (name, cfg, 1)
                };
                let func = self.f(name)?;
                if blocks > 8 {
                    // norm_tail_cluster16: a non-portable cluster size, allowed on the kernel.
                    self.set_attribute_once(
                        "norm_tail_cluster16: non-portable clusters",
                        &func,
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                        1,
                        "non-portable cluster size",
                    )?;
                }
                let mut b = words::Words::new(&self.stream);
                b.write(&mut resid.data)
                    .read(&src.data)
                    .read(w_post)
                    .f32(eps_post)
                    .read(w_next)
                    .f32(eps_next)
                    .i32(n)
                    .write(&mut next.data);
                if with_sums {
                    b.write(&mut next.xs);
                } else {
                    b.null();
                }
                // SAFETY: one block per row of n <= 8 * NORM_THREADS floats, or a cluster of
                // `blocks` blocks of 1024 / blocks threads per row of n <= 8192 (8 values a
                // thread; no sums then), in three equal-shaped buffers; the words follow the
                // kernel's parameters (the same for all); it waits first.
                unsafe { self.launch_ex(&func, cfg, b.vals(), self.pdl_small, blocks) }
                    .map_err(dev(name))?;
                resid.xs_ok = false;
                next.xs_ok = with_sums;
                Ok(())
            },
        )
    }

    fn logit_finish(&self, x: &mut CudaAct, scale: f32, softcap: Option<f32>) -> Result<()> {
        self.timed(
            || "logit_finish".to_string(),
            || {
                let n = (x.rows * x.cols) as i64;
                let cap = softcap.unwrap_or(0.0);
                let func = self.f("logit_finish")?;
                let mut b = words::Words::new(&self.stream);
                b.write(&mut x.data).i64(n).f32(scale).f32(cap);
                // SAFETY: elementwise over n floats; the words follow logit_finish's parameters;
                // it waits first.
                unsafe { self.launch_small(&func, grid1(n as usize, 256), &mut b) }
                    .map_err(dev("logit_finish"))?;
                x.xs_ok = false;
                Ok(())
            },
        )
    }

    fn select_rows(&self, x: &CudaAct, rows: &[usize], out: &mut CudaAct) -> Result<()> {
        check(out, rows.len(), x.cols, "select_rows")?;
        if let Some(&r) = rows.iter().find(|&&r| r >= x.rows) {
            return Err(Error::Backend(format!(
                "select_rows: row {r} of {}",
                x.rows
            )));
        }
        out.xs_ok = false;
        // The identity prefix (decode, teacher forcing) is a device copy: graph-capturable.
        if rows.iter().enumerate().all(|(i, &r)| i == r) {
            let src = x.data.slice(..rows.len() * x.cols);
            let mut dst = out.data.slice_mut(..rows.len() * x.cols);
            return self
                .stream
                .memcpy_dtod(&src, &mut dst)
                .map_err(dev("copy rows"));
        }
        let mut g = self.scratch()?;
        let s = g
            .as_mut()
            .ok_or_else(|| Error::Backend("no scratch".into()))?;
        let ids: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        self.stream
            .memcpy_htod(&ids, &mut s.rows)
            .map_err(dev("upload rows"))?;
        let cols = x.cols as i32;
        let func = self.f("select_rows")?;
        let mut b = self.stream.launch_builder(&func);
        b.arg(&x.data).arg(&s.rows).arg(&cols).arg(&mut out.data);
        let cfg = LaunchConfig {
            grid_dim: ((x.cols as u32).div_ceil(256).min(64), rows.len() as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: row indices were checked against x's rows.
        unsafe { b.launch(cfg) }.map_err(dev("select_rows"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::column_runs;

    /// The runs cover every column once, in order, each starting on a multiple of 8 and no
    /// longer than asked, with as few runs as that allows.
    #[test]
    fn column_runs_cover_the_columns_in_equal_runs() {
        for (k, most, want) in [
            (6656, 4096, vec![(0, 3328), (3328, 3328)]),
            (
                19968,
                4096,
                vec![
                    (0, 4000),
                    (4000, 4000),
                    (8000, 4000),
                    (12000, 4000),
                    (16000, 3968),
                ],
            ),
            (2048, 4096, vec![(0, 2048)]),
            (4096, 4096, vec![(0, 4096)]),
            (4104, 4096, vec![(0, 2056), (2056, 2048)]),
            (19968, 0, vec![(0, 19968)]),
            (40, 16, vec![(0, 16), (16, 16), (32, 8)]),
        ] {
            assert_eq!(
                column_runs(k, most).collect::<Vec<_>>(),
                want,
                "k {k} most {most}"
            );
        }
        for k in (8..20_000).step_by(8) {
            for most in [8, 1024, 2048, 4096] {
                let runs: Vec<_> = column_runs(k, most).collect();
                assert_eq!(runs.len(), k.div_ceil(most), "k {k} most {most}");
                let mut next = 0;
                for (k0, kn) in runs {
                    assert!(
                        k0 == next && k0 % 8 == 0 && kn > 0 && kn <= most,
                        "k {k} most {most}"
                    );
                    next = k0 + kn;
                }
                assert_eq!(next, k);
            }
        }
    }
}
