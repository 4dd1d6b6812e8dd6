//! `--fp8-weights`: in `--mode fast`, products of many tokens on Hopper's FP8 tensor cores
//! through cuBLASLt (kernels/dequant.cu, "Products of many tokens on the FP8 tensor cores"). Each
//! matrix keeps an e4m3 copy (1 byte per weight, one power-of-two scale per row), made at its
//! first such product; the activations go to e4m3 per token the same way; cuBLASLt sums in f32
//! and applies both scale vectors (or `y_scale_outer` does, where cuBLASLt cannot).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

use cudarc::cublaslt::{result as lt, sys as lts};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use muser_engine::{Error, Result};

use crate::{CudaAct, CudaBackend, CudaMatrix, dev, grid_runs8};

/// cuBLASLt's workspace (its recommendation for Hopper: 32 MiB).
const LT_WORKSPACE: usize = 32 << 20;
/// Algorithms asked of cuBLASLt's heuristic per product shape when tuning (`pick`), and the
/// K splits tried on each of them.
const TUNE_CANDIDATES: usize = 16;
const TUNE_SPLITS: [i32; 5] = [2, 3, 4, 6, 8];
/// Products of at most this many tokens are tuned by default (`pick`): the decode batches, whose
/// few tokens leave cuBLASLt's first choice short of the weights' bandwidth. On the H200
/// (2026-11-30, with attn_tcd2) tuning every shape decoded 32 sequences at 2,571.9 tokens/s
/// against 2,137.1 untuned, and 64 at 4,644.3 against 4,172.8, while 64 prompts of 512 tokens
/// ran at 13,692 against 13,635 tokens/s: no gain there, and a prompt chunk may take any length,
/// each a new shape to time. Tuning a batch size's five shapes ran 43 ms of candidate launches at
/// 32 tokens and 39 ms at 64 (the tuning log, same call): a server pays that once per batch size.
/// `MUSER_FP8_TUNE=1` tunes every product, `0` none.
pub(crate) const FP8_TUNE_MAX_TOKENS: usize = 128;
/// Matrices of fewer rows keep the other kernels (`MUSER_FP8_MIN_ROWS`, default 0: every
/// matrix, as measured). cuBLASLt's FP8 kernels give each block 64 or more rows, so a 256-row
/// matrix (the 30B's K and V) fills a few of the 132 SMs: on the H200 (2026-11-30) the K and V
/// pair took 50 us at 64 tokens on FP8, against 18 us at 32 tokens on the two-plane integer
/// kernels. `MUSER_FP8_MIN_ROWS=1024` keeps such matrices off FP8; its effect on a whole step is
/// not measured yet.
pub(crate) const FP8_MIN_ROWS: usize = 0;

/// A joint e4m3 copy (`joint8_ready`): matrices of one width stacked row-wise, each row times
/// its power of two as in `w8_ready`, and the rows' factors.
pub(crate) struct Joint8 {
    /// Each member's identity (its weights' device address) and rows, in order.
    members: Vec<(u64, usize)>,
    q: CudaSlice<u8>,
    down: CudaSlice<f32>,
}

/// The cuBLASLt state of one backend: its handle, its workspace (allocated with the handle, so
/// that a product recorded into a graph never allocates) and the algorithm chosen per shape.
pub(crate) struct Lt {
    handle: lts::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    /// (rows, tokens, cols, scales by cuBLASLt) -> its algorithm and, when tuned, its time (ms
    /// per product; infinite when not timed).
    algos: HashMap<(usize, usize, usize, bool), (lts::cublasLtMatmulAlgo_t, f32)>,
    /// (rows, tokens, cols) -> whether its scales go to cuBLASLt (the faster form when tuning
    /// timed both).
    forms: HashMap<(usize, usize, usize), bool>,
    /// Whether cuBLASLt applies outer-vector scales here (None: not asked yet).
    outer: Option<bool>,
    /// Whether the last product's scales were applied by cuBLASLt (None: none ran yet).
    last_outer: Option<bool>,
}

// SAFETY: the handle is only used under the backend's `lt` mutex (one thread at a time), and
// cuBLASLt handles are not tied to the thread that created them.
unsafe impl Send for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: the handle was created by create_handle and is destroyed once, here.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

fn lt_err(what: &'static str) -> impl FnOnce(cudarc::cublaslt::result::CublasError) -> Error {
    move |e| Error::Backend(format!("cuBLASLt {what}: {e:?}"))
}

/// Descriptors of one product, destroyed when dropped.
struct Desc {
    mm: lts::cublasLtMatmulDesc_t,
    layouts: [lts::cublasLtMatrixLayout_t; 3],
    pref: lts::cublasLtMatmulPreference_t,
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: each was created once by Desc::new (null where creation stopped) and is
        // destroyed once, here.
        unsafe {
            if !self.pref.is_null() {
                let _ = lt::destroy_matmul_pref(self.pref);
            }
            for l in self.layouts {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
            if !self.mm.is_null() {
                let _ = lt::destroy_matmul_desc(self.mm);
            }
        }
    }
}

impl Desc {
    /// D (m x n f32, leading dimension ldc) = op(A) B, A stored as m rows of k e4m3 (k x m
    /// column-major, transposed), B as n columns of k e4m3; with `scales`, A's row factors at
    /// `a_scale` (m floats) and B's column factors at `b_scale` (n floats) applied by cuBLASLt.
    fn new(m: usize, n: usize, k: usize, ldc: usize, scales: Option<(u64, u64)>) -> Result<Desc> {
        use lts::cublasLtMatmulDescAttributes_t as A;
        use lts::cudaDataType::{CUDA_R_8F_E4M3, CUDA_R_32F};
        let mut d = Desc {
            mm: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
            pref: std::ptr::null_mut(),
        };
        d.mm = lt::create_matmul_desc(lts::cublasComputeType_t::CUBLAS_COMPUTE_32F, CUDA_R_32F)
            .map_err(lt_err("descriptor"))?;
        let set = |attr: A, v: &[u8]| {
            // SAFETY: d.mm is live; v holds the attribute's value (an i32 or a pointer).
            unsafe {
                lt::set_matmul_desc_attribute(d.mm, attr, v.as_ptr() as *const c_void, v.len())
            }
            .map_err(lt_err("attribute"))
        };
        // 1: transposed (CUBLAS_OP_T), 0: as stored.
        set(A::CUBLASLT_MATMUL_DESC_TRANSA, &1i32.to_ne_bytes())?;
        set(A::CUBLASLT_MATMUL_DESC_TRANSB, &0i32.to_ne_bytes())?;
        if let Some((a_scale, b_scale)) = scales {
            let outer =
                (lts::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                    as i32)
                    .to_ne_bytes();
            set(A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer)?;
            set(A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer)?;
            set(
                A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                &a_scale.to_ne_bytes(),
            )?;
            set(
                A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                &b_scale.to_ne_bytes(),
            )?;
        }
        let to_i64 = |v: usize| v as i64;
        d.layouts[0] = lt::create_matrix_layout(CUDA_R_8F_E4M3, k as u64, m as u64, to_i64(k))
            .map_err(lt_err("layout"))?;
        d.layouts[1] = lt::create_matrix_layout(CUDA_R_8F_E4M3, k as u64, n as u64, to_i64(k))
            .map_err(lt_err("layout"))?;
        d.layouts[2] = lt::create_matrix_layout(CUDA_R_32F, m as u64, n as u64, to_i64(ldc))
            .map_err(lt_err("layout"))?;
        d.pref = lt::create_matmul_pref().map_err(lt_err("preference"))?;
        let ws = LT_WORKSPACE.to_ne_bytes();
        // SAFETY: d.pref is live; ws holds the u64/usize value of the attribute.
        unsafe {
            lt::set_matmul_pref_attribute(
                d.pref,
                lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                ws.as_ptr() as *const c_void,
                ws.len(),
            )
        }
        .map_err(lt_err("preference"))?;
        Ok(d)
    }

    /// cuBLASLt's candidate algorithms for these descriptors, its first choice first (at most
    /// `count`, each within the workspace).
    fn algos(&self, handle: lts::cublasLtHandle_t, count: usize) -> Vec<lts::cublasLtMatmulAlgo_t> {
        // SAFETY: an all-zero heuristic result is a valid value of this plain C struct (zero
        // algorithm words, size 0, CUBLAS_STATUS_SUCCESS, 0 waves).
        let zero: lts::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        let mut res = vec![zero; count];
        let mut got = 0i32;
        // SAFETY: every descriptor is live and describes the product it was made for; `res`
        // holds `count` results, the count asked for.
        let st = unsafe {
            lts::cublasLtMatmulAlgoGetHeuristic(
                handle,
                self.mm,
                self.layouts[0],
                self.layouts[1],
                self.layouts[2],
                self.layouts[2],
                self.pref,
                count as i32,
                res.as_mut_ptr(),
                &mut got,
            )
        };
        if st != lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Vec::new();
        }
        res.iter()
            .take(got.clamp(0, count as i32) as usize)
            .filter(|r| {
                r.state == lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                    && r.workspaceSize <= LT_WORKSPACE
            })
            .map(|r| r.algo)
            .collect()
    }

    /// `algo` with its K dimension split `parts` ways (the partial sums added by cuBLASLt), if
    /// the algorithm supports that and cuBLASLt accepts it for these descriptors within the
    /// workspace.
    fn split_k(
        &self,
        handle: lts::cublasLtHandle_t,
        algo: &lts::cublasLtMatmulAlgo_t,
        parts: i32,
    ) -> Option<lts::cublasLtMatmulAlgo_t> {
        if cap_i32(
            algo,
            lts::cublasLtMatmulAlgoCapAttributes_t::CUBLASLT_ALGO_CAP_SPLITK_SUPPORT,
        ) != Some(1)
        {
            return None;
        }
        // How the splits' partial sums are added (cuBLASLt needs one for a split): in place
        // where the algorithm can, else in the compute type, else in the output type.
        let mask = cap_i32(
            algo,
            lts::cublasLtMatmulAlgoCapAttributes_t::CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK,
        )? as u32;
        let scheme = [1u32, 2, 4].into_iter().find(|b| mask & b != 0)?;
        let mut a = *algo;
        use lts::cublasLtMatmulAlgoConfigAttributes_t as C;
        for (attr, v) in [
            (C::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, parts.to_ne_bytes()),
            (
                C::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                scheme.to_ne_bytes(),
            ),
        ] {
            // SAFETY: `a` is a copy of an initialized algorithm; v holds the attribute's 4-byte
            // value (int32 split count, uint32 scheme).
            let st = unsafe {
                lts::cublasLtMatmulAlgoConfigSetAttribute(
                    &mut a,
                    attr,
                    v.as_ptr() as *const c_void,
                    v.len(),
                )
            };
            if st != lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return None;
            }
        }
        // SAFETY: as in `algos`: an all-zero result is a valid value of this plain C struct.
        let mut r: lts::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        // SAFETY: every descriptor is live; `a` is initialized; `r` is written by the call.
        let st = unsafe {
            lts::cublasLtMatmulAlgoCheck(
                handle,
                self.mm,
                self.layouts[0],
                self.layouts[1],
                self.layouts[2],
                self.layouts[2],
                &a,
                &mut r,
            )
        };
        (st == lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS && r.workspaceSize <= LT_WORKSPACE)
            .then_some(a)
    }
}

fn cap_i32(
    algo: &lts::cublasLtMatmulAlgo_t,
    attr: lts::cublasLtMatmulAlgoCapAttributes_t,
) -> Option<i32> {
    let mut v = 0i32;
    let mut written = 0usize;
    // SAFETY: `algo` is initialized; the buffer holds the 4 bytes of an i32 attribute.
    let st = unsafe {
        lts::cublasLtMatmulAlgoCapGetAttribute(
            algo,
            attr,
            &mut v as *mut i32 as *mut c_void,
            4,
            &mut written,
        )
    };
    (st == lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS && written == 4).then_some(v)
}

/// An algorithm's configuration as text (the tuning log): its id, tile, split, stages and
/// cluster shape (cuBLASLt's enum values).
fn describe(algo: &lts::cublasLtMatmulAlgo_t) -> String {
    use lts::cublasLtMatmulAlgoConfigAttributes_t as C;
    let get = |attr: C| -> i64 {
        let mut v = [0u8; 8];
        // The attribute into the first `len` bytes of `v`: (status, bytes it holds).
        let mut query = |len: usize| {
            let mut size = 0usize;
            // SAFETY: `algo` is initialized and `v` holds 8 >= len bytes (len 0 asks only for
            // the attribute's size: cuBLASLt refuses a buffer of any other size than it).
            let st = unsafe {
                lts::cublasLtMatmulAlgoConfigGetAttribute(
                    algo,
                    attr,
                    v.as_mut_ptr() as *mut c_void,
                    len,
                    &mut size,
                )
            };
            (st == lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS, size)
        };
        let size = match query(0) {
            (true, size) if (1..=8).contains(&size) => size,
            _ => return -1,
        };
        match query(size) {
            (true, 4) => i32::from_ne_bytes([v[0], v[1], v[2], v[3]]) as i64,
            (true, 8) => i64::from_ne_bytes(v),
            (true, 2) => u16::from_ne_bytes([v[0], v[1]]) as i64,
            _ => -1,
        }
    };
    format!(
        "id {} tile {} splitk {} reduction {} stages {} cluster {} swizzle {}",
        get(C::CUBLASLT_ALGO_CONFIG_ID),
        get(C::CUBLASLT_ALGO_CONFIG_TILE_ID),
        get(C::CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
        get(C::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
        get(C::CUBLASLT_ALGO_CONFIG_STAGES_ID),
        get(C::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
        get(C::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
    )
}

/// The device addresses of one FP8 product: A, B, D (C = D), the workspace.
#[derive(Clone, Copy)]
struct Operands {
    a: u64,
    b: u64,
    c: u64,
    ws: u64,
}

/// D = op(A) B (times the scales `d` carries) with `algo`, on `stream`.
///
/// # Safety
/// `d` must describe the operands' shapes; their buffers (and the scale vectors `d` points at)
/// must stay alive until the stream has run the product; `ops.ws` must hold LT_WORKSPACE bytes.
unsafe fn launch(
    handle: lts::cublasLtHandle_t,
    d: &Desc,
    algo: &lts::cublasLtMatmulAlgo_t,
    ops: Operands,
    stream: lts::cudaStream_t,
) -> Result<()> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: as the caller guarantees; alpha and beta are host values read at the call (the
    // default host pointer mode).
    unsafe {
        lt::matmul(
            handle,
            d.mm,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            ops.a as *const c_void,
            d.layouts[0],
            ops.b as *const c_void,
            d.layouts[1],
            ops.c as *const c_void,
            d.layouts[2],
            ops.c as *mut c_void,
            d.layouts[2],
            algo,
            ops.ws as *mut c_void,
            LT_WORKSPACE,
            stream,
        )
    }
    .map_err(lt_err("matmul"))
}

impl CudaBackend {
    /// `--fp8-weights`: in `--mode fast`, products of more than `gemm8_min` tokens on the FP8
    /// tensor cores, each matrix keeping an e4m3 copy (1 byte per weight, made at its first such
    /// product). Needs compute capability 8.9 or newer and cuBLASLt.
    pub fn set_fp8_weights(&self, on: bool) -> Result<()> {
        if on {
            if self.cc < (8, 9) {
                return Err(Error::Backend(format!(
                    "--fp8-weights needs FP8 tensor cores (compute capability 8.9 or newer); this device is {}.{}",
                    self.cc.0, self.cc.1
                )));
            }
            // SAFETY: only tries to dlopen the library by name.
            if !unsafe { lts::is_culib_present() } {
                return Err(Error::Backend(
                    "--fp8-weights needs cuBLASLt (libcublasLt.so), which cannot be loaded".into(),
                ));
            }
            let mut g = self
                .lt
                .lock()
                .map_err(|_| Error::Backend("cuBLASLt state poisoned".into()))?;
            if g.is_none() {
                let handle = lt::create_handle().map_err(lt_err("handle"))?;
                let workspace = match self.stream.alloc_zeros::<u8>(LT_WORKSPACE) {
                    Ok(w) => w,
                    Err(e) => {
                        // SAFETY: created just above, destroyed once.
                        let _ = unsafe { lt::destroy_handle(handle) };
                        return Err(dev("alloc")(e));
                    }
                };
                *g = Some(Lt {
                    handle,
                    workspace,
                    algos: HashMap::new(),
                    forms: HashMap::new(),
                    outer: None,
                    last_outer: None,
                });
            }
        }
        self.fp8_weights.store(on, Relaxed);
        self.bump_epoch();
        Ok(())
    }

    /// Whether cuBLASLt may apply the FP8 products' scales itself (`MUSER_FP8_OUTER=0`, or
    /// false here: `y_scale_outer` after it). The same values either way (powers of two).
    pub fn set_fp8_outer_scales(&self, on: bool) {
        self.fp8_outer.store(on, Relaxed);
        if let Ok(mut g) = self.lt.lock()
            && let Some(l) = g.as_mut()
        {
            l.outer = None;
        }
        self.bump_epoch();
    }

    /// The token count above which `--fp8-weights` takes a product (default 32).
    pub fn set_gemm8_min_tokens(&self, n: usize) {
        self.gemm8_min.store(n, Relaxed);
        self.bump_epoch();
    }

    /// Whether `w`'s products go to the FP8 tensor cores now: `--fp8-weights` is on, the shape
    /// suits cuBLASLt's FP8 kernels (rows of a multiple of 16 bytes, f32 outputs in 16-byte
    /// rows), and the e4m3 copy exists or is made here (where `room_for_copy` allows; past
    /// that, products go the f16 way).
    pub(crate) fn w8_ready(&self, w: &CudaMatrix) -> Result<bool> {
        if !self.fp8_weights.load(Relaxed)
            || !w.cols.is_multiple_of(16)
            || !w.rows.is_multiple_of(4)
            || w.rows < self.fp8_min_rows.load(Relaxed)
        {
            return Ok(false);
        }
        if w.w8.get().is_some() {
            return Ok(true);
        }
        if !self.room_for_copy(w.rows * w.cols + 4 * w.rows) {
            return Ok(false);
        }
        let st = &self.stream;
        let (Ok(mut q), Ok(mut down)) = (
            st.alloc_zeros::<u8>(w.rows * w.cols),
            st.alloc_zeros::<f32>(w.rows),
        ) else {
            return Ok(false);
        };
        {
            let (qp, _gq) = q.device_ptr_mut(st);
            let (dp, _gd) = down.device_ptr_mut(st);
            // SAFETY: q holds rows x cols bytes and down rows floats (allocated above).
            unsafe { self.w8_fill(w, qp, dp) }?;
        }
        let _ = w.w8.set((q, down));
        Ok(true)
    }

    /// `w`'s e4m3 rows at `q` (rows x cols bytes, row-major) and their factors 2^-S_r at `down`
    /// (rows floats): `w8_rowscale`, then `w8_rows`.
    ///
    /// # Safety
    /// `q` and `down` must address that much device memory of this backend, valid until the
    /// stream has run both kernels.
    unsafe fn w8_fill(&self, w: &CudaMatrix, q: u64, down: u64) -> Result<()> {
        let st = &self.stream;
        let (cols_i, rows_i) = (w.cols as i32, w.rows as i32);
        {
            let f = self.f("w8_rowscale")?;
            let mut b = st.launch_builder(&f);
            b.arg(&w.data)
                .arg(&w.fmt)
                .arg(&w.nbt)
                .arg(&cols_i)
                .arg(&rows_i)
                .arg(&down);
            let cfg = LaunchConfig {
                grid_dim: ((w.rows as u32).clamp(1, 65_535), 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: reads the matrix's rows x cols elements (cols a multiple of 16), writes
            // rows floats at `down` (the caller's guarantee).
            unsafe { b.launch(cfg) }.map_err(dev("w8_rowscale"))?;
        }
        let f = self.f("w8_rows")?;
        let ld = w.cols as i64;
        let mut b = st.launch_builder(&f);
        b.arg(&w.data)
            .arg(&w.fmt)
            .arg(&w.nbt)
            .arg(&cols_i)
            .arg(&rows_i)
            .arg(&down)
            .arg(&q)
            .arg(&ld);
        let cfg = grid_runs8(w.cols, w.rows);
        // SAFETY: reads every row of the matrix and its row factors (written just above);
        // writes rows x cols bytes at `q` (the caller's guarantee, ld = cols).
        unsafe { b.launch(cfg) }.map_err(dev("w8_rows"))?;
        Ok(())
    }

    /// out = W x on the FP8 tensor cores: W's e4m3 copy (w8_ready) times the e4m3 activations
    /// at `x8` (out.rows tokens of w.cols bytes, x8_rowquant), f32 sums, times each row's and
    /// each token's factor (`x_down`, x8_rowquant's).
    pub(crate) fn gemm8(
        &self,
        w: &CudaMatrix,
        x8: &CudaSlice<u8>,
        x_down: &CudaSlice<f32>,
        out: &mut CudaAct,
    ) -> Result<()> {
        let Some((q, w_down)) = w.w8.get() else {
            return Err(Error::Backend("gemm8: the matrix has no e4m3 copy".into()));
        };
        let st = &self.stream;
        let (a, _ga) = q.device_ptr(st);
        let (a_scale, _gas) = w_down.device_ptr(st);
        let (b, _gb) = x8.device_ptr(st);
        let (b_scale, _gbs) = x_down.device_ptr(st);
        let (c, _gc) = out.data.device_ptr_mut(st);
        let shape = (w.rows, out.rows, w.cols);
        // SAFETY: q holds rows x cols bytes and w_down rows floats (w8_ready); the caller grew
        // x8 to out.rows x cols bytes and x_down to out.rows floats; out holds out.rows x rows
        // floats (checked by matmul). The guards keep them alive past the launches.
        unsafe { self.gemm8_raw(shape, a, a_scale, b, b_scale, c) }
    }

    /// D (n x m f32 at `c`, token-major) = A (m rows of k e4m3 at `a`) times B (n tokens of k
    /// e4m3 at `b`), times A's row factors (m floats at `a_scale`) and B's token factors (n
    /// floats at `b_scale`): by cuBLASLt's outer-vector scales where it has an algorithm for
    /// them, else by `y_scale_outer` after it.
    ///
    /// # Safety
    /// The addresses must hold what is described, on this backend's device, until the stream
    /// has run the product.
    unsafe fn gemm8_raw(
        &self,
        (m, n, k): (usize, usize, usize),
        a: u64,
        a_scale: u64,
        b: u64,
        b_scale: u64,
        c: u64,
    ) -> Result<()> {
        let mut g = self
            .lt
            .lock()
            .map_err(|_| Error::Backend("cuBLASLt state poisoned".into()))?;
        let l = g
            .as_mut()
            .ok_or_else(|| Error::Backend("gemm8: cuBLASLt not set up".into()))?;
        let st = &self.stream;
        let (ws, _gw) = l.workspace.device_ptr(st);
        let ops = Operands { a, b, c, ws };
        // Outer-vector scales where cuBLASLt has an algorithm for them (asked once per
        // backend, and again after set_fp8_outer_scales). With tuning, both forms are timed
        // per shape (the other one's time with `y_scale_outer` after it) and the faster kept.
        let want_outer = self.fp8_outer.load(Relaxed) && l.outer != Some(false);
        let shape = (m, n, k);
        let mut chosen = None;
        let mut outer = false;
        if want_outer && l.forms.get(&shape) != Some(&false) {
            let d = Desc::new(m, n, k, m, Some((a_scale, b_scale)))?;
            match self.pick(l.handle, &mut l.algos, &d, (m, n, k, true), ops)? {
                Some((a, t_outer)) => {
                    l.outer = Some(true);
                    let tune = n <= self.fp8_tune_max.load(Relaxed) && !self.capturing.load(SeqCst);
                    let mut keep = true;
                    if tune && !l.forms.contains_key(&shape) {
                        let dp = Desc::new(m, n, k, m, None)?;
                        if let Some((_, t_plain)) =
                            self.pick(l.handle, &mut l.algos, &dp, (m, n, k, false), ops)?
                        {
                            // SAFETY: as for the product below (c holds n x m floats, the
                            // scale vectors m and n).
                            let t_scale = unsafe { self.time_y_scale(c, m, n, a_scale, b_scale) }?;
                            keep = t_outer <= t_plain + t_scale;
                            if std::env::var("MUSER_FP8_TUNE_LOG").is_ok_and(|v| v == "1") {
                                eprintln!(
                                    "fp8 tune {m}x{k} x {n} tokens: scales by cuBLASLt {:.1} us, after it {:.1} + {:.1} us: {}",
                                    t_outer * 1e3,
                                    t_plain * 1e3,
                                    t_scale * 1e3,
                                    if keep { "by cuBLASLt" } else { "after it" }
                                );
                            }
                        }
                        l.forms.insert(shape, keep);
                    }
                    if keep {
                        outer = true;
                        chosen = Some((d, a));
                    }
                }
                None => l.outer = Some(false),
            }
        }
        let (d, algo) = match chosen {
            Some(x) => x,
            None => {
                let d = Desc::new(m, n, k, m, None)?;
                let (a, _) = self
                    .pick(l.handle, &mut l.algos, &d, (m, n, k, false), ops)?
                    .ok_or_else(|| {
                        Error::Backend(format!(
                            "cuBLASLt has no FP8 algorithm for {m}x{k} times {n} tokens"
                        ))
                    })?;
                (d, a)
            }
        };
        // SAFETY: the descriptors describe A (m x k bytes), B (n x k bytes), D (n x m floats,
        // ldc = m) and, when set, the scale vectors, as the caller guarantees; the workspace is
        // this handle's (LT_WORKSPACE bytes, the size the preference allows).
        unsafe {
            launch(
                l.handle,
                &d,
                &algo,
                ops,
                st.cu_stream() as lts::cudaStream_t,
            )
        }?;
        l.last_outer = Some(outer);
        drop(_gw);
        if !outer {
            // SAFETY: D holds n x m floats at c, the scale vectors m and n (the caller's
            // guarantee).
            unsafe { self.y_scale(c, m, n, a_scale, b_scale) }?;
        }
        self.fp8_count.fetch_add(1, Relaxed);
        Ok(())
    }

    /// D (n x m f32 at `c`) times A's row factors (m floats at `a_scale`) and B's token factors
    /// (n floats at `b_scale`), in place (`y_scale_outer`).
    ///
    /// # Safety
    /// The addresses must hold what is described until the stream has run the kernel.
    unsafe fn y_scale(&self, c: u64, m: usize, n: usize, a_scale: u64, b_scale: u64) -> Result<()> {
        let f = self.f("y_scale_outer")?;
        let (rows_i, width_i) = (n as i32, m as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&c)
            .arg(&rows_i)
            .arg(&width_i)
            .arg(&a_scale)
            .arg(&b_scale);
        let cfg = LaunchConfig {
            grid_dim: (
                (m as u32).div_ceil(256).clamp(1, 1024),
                (n as u32).clamp(1, 65_535),
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: scales n x m floats at c in place, reading m floats at a_scale and n at
        // b_scale (the caller's guarantee).
        unsafe { b.launch(cfg) }.map_err(dev("y_scale_outer"))?;
        Ok(())
    }

    /// Milliseconds of one `y_scale` of this shape (one run, then 3 between events). It scales
    /// D in place: the caller's product overwrites D afterwards.
    ///
    /// # Safety
    /// As `y_scale`.
    unsafe fn time_y_scale(
        &self,
        c: u64,
        m: usize,
        n: usize,
        a_scale: u64,
        b_scale: u64,
    ) -> Result<f32> {
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let e0 = self.ctx.new_event(flags).map_err(dev("event"))?;
        let e1 = self.ctx.new_event(flags).map_err(dev("event"))?;
        // SAFETY: the caller's guarantee, for each run.
        unsafe { self.y_scale(c, m, n, a_scale, b_scale) }?;
        e0.record(&self.stream).map_err(dev("event"))?;
        for _ in 0..3 {
            // SAFETY: as above.
            unsafe { self.y_scale(c, m, n, a_scale, b_scale) }?;
        }
        e1.record(&self.stream).map_err(dev("event"))?;
        Ok(e0.elapsed_ms(&e1).map_err(dev("event timing"))? / 3.0)
    }

    /// The micro-batch x (n x cols f32) into e4m3 at `x8` (n rows of cols bytes), each token
    /// times its power of two (its largest |x| into [2^7, 2^8)), whose inverses go to `down` (n
    /// floats); the largest |x| of each token goes to `xmax` too, as x16_rowmax writes it (the
    /// f16 products of the same call read it).
    pub(crate) fn x8_rowquant(
        &self,
        x: &CudaAct,
        xmax: &mut CudaSlice<u32>,
        x8: &mut CudaSlice<u8>,
        down: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let f = self.f("x8_rowquant")?;
        let (cols_i, ld) = (x.cols as i32, x.cols as i64);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&x.data)
            .arg(&cols_i)
            .arg(xmax)
            .arg(x8)
            .arg(&ld)
            .arg(down);
        let cfg = LaunchConfig {
            grid_dim: (x.rows as u32, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: one block per token (x.rows, at most MAX_BATCH_TOKENS) reads its cols floats (a multiple
        // of 16: w8_ready) and writes its word of xmax and of down and its cols bytes of x8
        // (the caller grew all three to x.rows tokens).
        unsafe { b.launch(cfg) }.map_err(dev("x8_rowquant"))?;
        Ok(())
    }

    /// Whether `ws` (2 to 4 matrices of one width, products of the same input) have a joint
    /// e4m3 copy now, made here where missing (`room_for_copy` allowing): the shape rules of
    /// `w8_ready` for each, the copy kept on ws[0] for this group only (another group with the
    /// same first matrix gets its products one by one).
    pub(crate) fn joint8_ready(&self, ws: &[&CudaMatrix]) -> Result<bool> {
        let Some(first) = ws.first() else {
            return Ok(false);
        };
        let cols = first.cols;
        if !self.fp8_weights.load(Relaxed)
            || !(2..=4).contains(&ws.len())
            || !cols.is_multiple_of(16)
            || ws.iter().any(|w| {
                w.cols != cols
                    || !w.rows.is_multiple_of(4)
                    || w.rows < self.fp8_min_rows.load(Relaxed)
            })
        {
            return Ok(false);
        }
        let st = &self.stream;
        let members: Vec<(u64, usize)> = ws
            .iter()
            .map(|w| (w.data.device_ptr(st).0, w.rows))
            .collect();
        if let Some(j) = first.w8_joint.get() {
            return Ok(j.members == members);
        }
        let rows: usize = ws.iter().map(|w| w.rows).sum();
        if !self.room_for_copy(rows * cols + 4 * rows) {
            return Ok(false);
        }
        let (Ok(mut q), Ok(mut down)) = (
            st.alloc_zeros::<u8>(rows * cols),
            st.alloc_zeros::<f32>(rows),
        ) else {
            return Ok(false);
        };
        {
            let (qp, _gq) = q.device_ptr_mut(st);
            let (dp, _gd) = down.device_ptr_mut(st);
            let mut r0 = 0usize;
            for w in ws {
                // SAFETY: q holds the group's rows x cols bytes and down its rows floats
                // (allocated above); member w's start at row r0.
                unsafe { self.w8_fill(w, qp + (r0 * cols) as u64, dp + 4 * r0 as u64) }?;
                r0 += w.rows;
            }
        }
        let _ = first.w8_joint.set(Joint8 { members, q, down });
        Ok(true)
    }

    /// The products of the joint copy of `ws` (joint8_ready) with x (n tokens) into the
    /// scratch's `y8`: n rows of the members' total rows, member j's outputs at columns from
    /// the rows of the ones before it. Returns that width.
    pub(crate) fn joint8(
        &self,
        ws: &[&CudaMatrix],
        x: &CudaAct,
        s: &mut crate::Scratch,
    ) -> Result<usize> {
        let j = ws
            .first()
            .and_then(|w| w.w8_joint.get())
            .ok_or_else(|| Error::Backend("joint8: the group has no joint e4m3 copy".into()))?;
        let (n, cols) = (x.rows, x.cols);
        let width: usize = j.members.iter().map(|m| m.1).sum();
        if ws.iter().any(|w| w.cols != cols) {
            return Err(Error::Backend(format!(
                "joint8: input {n}x{cols}, matrices of {} columns",
                ws[0].cols
            )));
        }
        self.grow(&mut s.x8, n * cols)?;
        self.grow(&mut s.x8down, n)?;
        self.grow(&mut s.x16max, n)?;
        self.grow(&mut s.y8, n * width)?;
        self.x8_rowquant(x, &mut s.x16max, &mut s.x8, &mut s.x8down)?;
        let st = &self.stream;
        let (a, _ga) = j.q.device_ptr(st);
        let (a_scale, _gas) = j.down.device_ptr(st);
        let (b, _gb) = s.x8.device_ptr(st);
        let (b_scale, _gbs) = s.x8down.device_ptr(st);
        let (c, _gc) = s.y8.device_ptr_mut(st);
        // SAFETY: the joint copy holds width x cols bytes and width factors; x8 and x8down
        // hold n tokens (written just above), y8 n x width floats (grown above). The guards
        // keep them alive past the launches.
        unsafe { self.gemm8_raw((width, n, cols), a, a_scale, b, b_scale, c) }?;
        Ok(width)
    }

    /// y8's joint outputs (`joint8`, `width` columns) apart into `outs`, in the group's order.
    pub(crate) fn y8_split(
        &self,
        y8: &CudaSlice<f32>,
        width: usize,
        outs: &mut [&mut CudaAct],
    ) -> Result<()> {
        let n = outs.first().map_or(0, |o| o.rows);
        let total: usize = outs.iter().map(|o| o.cols).sum();
        if outs.len() > 4
            || total != width
            || outs
                .iter()
                .any(|o| o.rows != n || !o.cols.is_multiple_of(4))
            || y8.len() < n * width
        {
            return Err(Error::Backend(format!(
                "y8_split: {} outputs of {total} columns from {width}",
                outs.len()
            )));
        }
        let st = &self.stream;
        let mut ptrs = [(0u64, 0i32); 4];
        let mut guards = Vec::with_capacity(outs.len());
        for (p, o) in ptrs.iter_mut().zip(outs.iter_mut()) {
            let (ptr, gd) = o.data.device_ptr_mut(st);
            *p = (ptr, o.cols as i32);
            guards.push(gd);
        }
        let f = self.f("y_split4")?;
        let (rows_i, width_i) = (n as i32, width as i32);
        let mut b = st.launch_builder(&f);
        b.arg(y8).arg(&rows_i).arg(&width_i);
        for (ptr, w) in &ptrs {
            b.arg(ptr).arg(w);
        }
        let cfg = LaunchConfig {
            grid_dim: (
                (width as u32 / 4).div_ceil(128),
                (n as u32).clamp(1, 65_535),
                1,
            ),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: reads n x width floats of y8 (checked above); output j receives n rows of
        // its cols floats (its own buffer, n rows checked above); unused outputs have width 0.
        unsafe { b.launch(cfg) }.map_err(dev("y_split4"))?;
        drop(guards);
        for o in outs.iter_mut() {
            o.xs_ok = false;
        }
        Ok(())
    }

    /// How many products have run on the FP8 tensor cores (tests: that a path was taken).
    pub fn fp8_products(&self) -> u64 {
        self.fp8_count.load(Relaxed)
    }

    /// The algorithm for one product shape and scale form, and its time per product (infinite
    /// when not timed): the one chosen before, else cuBLASLt's first choice (kept, except while a
    /// graph is recorded), or for products of at most `fp8_tune_max` tokens (FP8_TUNE_MAX_TOKENS
    /// by default, `MUSER_FP8_TUNE`) its first TUNE_CANDIDATES candidates, each
    /// also with its K split TUNE_SPLITS ways where cuBLASLt allows, timed on these operands (one
    /// run, then 3 between events; the fastest kept; `MUSER_FP8_TUNE_LOG=1` prints each). None:
    /// no algorithm for these descriptors. `gemm8_raw` then also compares the two scale forms.
    ///
    /// The outer-vector scale form has one candidate per shape (H200, 2026-11-30); the gain is
    /// the other form's candidates and K splits where they win (FP8_TUNE_MAX_TOKENS). Tuning
    /// runs in eager steps only (a step's shape runs eagerly once before it is recorded), so a
    /// server pays it at the first step of each batch size. Tuning writes the output (the
    /// caller's product overwrites it) and waits for the device once per shape. The candidates
    /// sum in different orders, so a tuned choice can differ from one process to the next
    /// (timing), and with it the outputs' last bits; within a process a shape keeps its algorithm.
    fn pick(
        &self,
        handle: lts::cublasLtHandle_t,
        algos: &mut HashMap<(usize, usize, usize, bool), (lts::cublasLtMatmulAlgo_t, f32)>,
        d: &Desc,
        key: (usize, usize, usize, bool),
        ops: Operands,
    ) -> Result<Option<(lts::cublasLtMatmulAlgo_t, f32)>> {
        if let Some(a) = algos.get(&key) {
            return Ok(Some(*a));
        }
        let capturing = self.capturing.load(SeqCst);
        let tune = key.1 <= self.fp8_tune_max.load(Relaxed) && !capturing;
        let mut cands = d.algos(handle, if tune { TUNE_CANDIDATES } else { 1 });
        let Some(first) = cands.first().copied() else {
            return Ok(None);
        };
        if !tune {
            // Not kept while a graph is recorded (a later eager product may tune the shape).
            if !capturing {
                algos.insert(key, (first, f32::INFINITY));
            }
            return Ok(Some((first, f32::INFINITY)));
        }
        // Each candidate also with its K dimension split (cuBLASLt's heuristic seldom offers
        // splits for few tokens, where they give the SMs work enough).
        let splits: Vec<_> = cands
            .iter()
            .flat_map(|a| TUNE_SPLITS.iter().filter_map(|&p| d.split_k(handle, a, p)))
            .collect();
        let log = std::env::var("MUSER_FP8_TUNE_LOG").is_ok_and(|v| v == "1");
        if log {
            let (m, n, k, outer) = key;
            eprintln!(
                "fp8 tune {m}x{k} x {n} tokens (outer {outer}): {} candidates, {} K splits accepted",
                cands.len(),
                splits.len()
            );
        }
        cands.extend(splits);
        let stream = self.stream.cu_stream() as lts::cudaStream_t;
        let mut best = (f32::INFINITY, first);
        {
            let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            let e0 = self.ctx.new_event(flags).map_err(dev("event"))?;
            let e1 = self.ctx.new_event(flags).map_err(dev("event"))?;
            for a in &cands {
                // SAFETY: as in gemm8 (the caller's operands, alive until the stream has run
                // these products: elapsed_ms waits for it before they are released).
                if unsafe { launch(handle, d, a, ops, stream) }.is_err() {
                    continue;
                }
                e0.record(&self.stream).map_err(dev("event"))?;
                let mut ok = true;
                for _ in 0..3 {
                    // SAFETY: as above.
                    ok &= unsafe { launch(handle, d, a, ops, stream) }.is_ok();
                }
                e1.record(&self.stream).map_err(dev("event"))?;
                let ms = e0.elapsed_ms(&e1).map_err(dev("event timing"))?;
                if log {
                    let (m, n, k, outer) = key;
                    let us = ms * 1e3 / 3.0;
                    eprintln!(
                        "fp8 tune {m}x{k} x {n} tokens (outer {outer}): {us:.1} us, {:.0} GB/s of weights{}: {}",
                        (m * k) as f64 / (us as f64 * 1e3),
                        if ok { "" } else { " (failed)" },
                        describe(a)
                    );
                }
                if ok && ms < best.0 {
                    best = (ms, *a);
                }
            }
        }
        if log {
            eprintln!("fp8 tune {key:?} chose {}", describe(&best.1));
        }
        // Per product: the candidates ran 3 times between the events.
        let chosen = (best.1, best.0 / 3.0);
        algos.insert(key, chosen);
        Ok(Some(chosen))
    }

    /// Whether the last FP8 product's scales were applied by cuBLASLt (None: none ran yet).
    pub fn fp8_outer_scales_used(&self) -> Option<bool> {
        self.lt
            .lock()
            .ok()
            .and_then(|g| g.as_ref().and_then(|l| l.last_outer))
    }
}
