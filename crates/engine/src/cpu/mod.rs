//! The CPU backend: weights borrowed from the memory map, f32 activations in host memory,
//! rayon for all cores.
//!
//! Two numeric modes share the model: `accurate` (exact dequantization, f32 activations and
//! products, f64 reductions) and `parity` (llama.cpp's ggml-cpu arithmetic, see `ggml`).

pub mod attention;
pub mod cuda_anchor;
pub mod ggml;
pub mod matmul;
pub mod ops;
pub mod parity;

use std::sync::Arc;

use muser_gguf::Gguf;
use rayon::prelude::*;

use crate::backend::{AttnSpec, Backend, Batch};
use crate::config::MuseConfig;
use crate::error::{Error, Result};
use crate::formats;
use crate::kv::{HostKv, KvType};
use crate::loader::Matrix;

/// Which arithmetic the CPU backend performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NumericMode {
    /// Exact dequantization, f32 activations and accumulation (the default).
    #[default]
    Accurate,
    /// Round and accumulate exactly where llama.cpp b11434's CPU backend does.
    Parity,
    /// The accurate mode with llama.cpp b11434's CUDA products of one token (`cuda_anchor`:
    /// q8_1 activations for quantized weights, f16 sums for F16 weights): a model of what
    /// its CUDA build computes, checked against its committed logits.
    CudaParity,
}

impl NumericMode {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "accurate" => Ok(Self::Accurate),
            "parity" => Ok(Self::Parity),
            "cuda-parity" => Ok(Self::CudaParity),
            _ => Err(Error::Input(format!(
                "unknown numeric mode '{s}' (expected accurate, parity or cuda-parity)"
            ))),
        }
    }
}

/// Where a matrix's bytes live: the file's memory map (no copy), or memory of its own (a shard).
enum MatrixBytes {
    Mapped(Arc<Gguf>),
    Owned(Vec<u8>),
}

/// A weight matrix, borrowed from the file's memory map or owned.
pub struct CpuMatrix {
    src: MatrixBytes,
    pub m: Matrix,
}

impl CpuMatrix {
    pub fn bytes(&self) -> &[u8] {
        match &self.src {
            MatrixBytes::Mapped(file) => self.m.bytes(file),
            MatrixBytes::Owned(v) => v,
        }
    }
}

/// Row-major f32 activations.
#[derive(Clone, Debug)]
pub struct CpuAct {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl CpuAct {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }
}

pub struct CpuBackend {
    pub mode: NumericMode,
    pool: rayon::ThreadPool,
    n_threads: usize,
    /// Parity mode: llama.cpp's n_ubatch, which sizes its sliding-window cache (default 512).
    pub parity_ubatch: usize,
    /// Report `draws_on_device`: callers then choose tokens through `Backend::draw_rows`
    /// (`RowDraw`, the device backends' draw, computed here on the host). Off by default;
    /// the server's tests turn it on to run its device-draw path without a GPU.
    pub row_draws: bool,
}

impl CpuBackend {
    /// A CPU backend using `threads` threads (0 = all cores).
    pub fn new(mode: NumericMode, threads: usize) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| Error::Backend(format!("cannot start CPU threads: {e}")))?;
        let n_threads = pool.current_num_threads();
        Ok(CpuBackend {
            mode,
            pool,
            n_threads,
            parity_ubatch: 512,
            row_draws: false,
        })
    }

    pub fn threads(&self) -> usize {
        self.n_threads
    }

    /// Run `f` on this backend's thread pool.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }
}

fn check(a: &CpuAct, rows: usize, cols: usize, what: &str) -> Result<()> {
    if a.rows != rows || a.cols != cols {
        return Err(Error::Backend(format!(
            "{what}: shape {}x{}, expected {rows}x{cols}",
            a.rows, a.cols
        )));
    }
    Ok(())
}

impl Backend for CpuBackend {
    type Matrix = CpuMatrix;
    type Vector = Vec<f32>;
    type Act = CpuAct;
    type Kv = HostKv;

    fn name(&self) -> String {
        format!("cpu ({} threads, {:?} mode)", self.n_threads, self.mode)
    }

    fn run_ops(&self, ops: &mut (dyn FnMut() -> Result<()> + Send)) -> Result<()> {
        // On a worker of the pool: each operation's `install` then runs in place, and its
        // parallel loops share the work with the other workers, instead of the calling thread
        // handing every operation over and sleeping until it is done.
        self.install(ops)
    }

    fn draws_on_device(&self) -> bool {
        self.row_draws
    }

    /// Accurate-mode attention reads each token's own sequence (cpu/attention.rs); parity mode
    /// keeps llama.cpp's single-sequence cell layout.
    fn max_sequences_per_batch(&self) -> usize {
        match self.mode {
            NumericMode::Accurate | NumericMode::CudaParity => usize::MAX,
            NumericMode::Parity => 1,
        }
    }

    fn matrix(&self, file: &Arc<Gguf>, m: &Matrix) -> Result<CpuMatrix> {
        Ok(CpuMatrix {
            src: MatrixBytes::Mapped(file.clone()),
            m: m.clone(),
        })
    }

    fn matrix_from_bytes(&self, m: &Matrix, bytes: &[u8]) -> Result<CpuMatrix> {
        m.check_bytes(bytes)?;
        Ok(CpuMatrix {
            src: MatrixBytes::Owned(bytes.to_vec()),
            m: m.clone(),
        })
    }

    fn write(&self, a: &mut CpuAct, values: &[f32]) -> Result<()> {
        if values.len() > a.data.len() {
            return Err(Error::Backend(format!(
                "write of {} values into {}",
                values.len(),
                a.data.len()
            )));
        }
        a.data[..values.len()].copy_from_slice(values);
        Ok(())
    }

    fn vector(&self, v: &[f32]) -> Result<Vec<f32>> {
        Ok(v.to_vec())
    }

    fn act(&self, rows: usize, cols: usize) -> Result<CpuAct> {
        Ok(CpuAct {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        })
    }

    fn set_rows(&self, a: &mut CpuAct, rows: usize) -> Result<()> {
        if rows * a.cols > a.data.capacity() {
            return Err(Error::Backend(format!(
                "activation of {} rows cannot hold {rows}",
                a.data.capacity() / a.cols.max(1)
            )));
        }
        a.rows = rows;
        a.data.resize(rows * a.cols, 0.0);
        Ok(())
    }

    fn kv_cache(&self, cfg: &MuseConfig, ty: KvType, n_ctx: usize) -> Result<HostKv> {
        let mut kv = HostKv::new(cfg, ty, n_ctx)?;
        if self.mode == NumericMode::Parity {
            kv.parity = Some(parity::ParityKv::new(cfg, ty, n_ctx, self.parity_ubatch)?);
        }
        Ok(kv)
    }

    fn kv_capacity(&self, kv: &HostKv) -> usize {
        kv.n_ctx
    }

    fn kv_len(&self, kv: &HostKv) -> usize {
        kv.len
    }

    fn kv_set_len(&self, kv: &mut HostKv, len: usize) {
        if len < kv.len {
            kv.truncate(len);
        } else {
            kv.len = len;
        }
    }

    fn kv_can_truncate(&self, kv: &HostKv, len: usize) -> bool {
        kv.can_truncate(len)
    }

    fn kv_clear(&self, kv: &mut HostKv) {
        kv.clear()
    }

    /// Not in parity mode, whose cache keeps llama.cpp's cell layout.
    fn kv_can_copy(&self) -> bool {
        self.mode != NumericMode::Parity
    }

    fn kv_copy(&self, src: &HostKv, dst: &mut HostKv) -> Result<()> {
        dst.copy_from(src)
    }

    fn kv_export(&self, kv: &HostKv) -> Result<crate::state::KvImage> {
        kv.export()
    }

    fn kv_import(&self, image: &crate::state::KvImage, kv: &mut HostKv) -> Result<()> {
        kv.import(image)
    }

    fn read(&self, a: &CpuAct) -> Result<Vec<f32>> {
        Ok(a.data.clone())
    }

    fn read_into(&self, a: &CpuAct, out: &mut Vec<f32>) -> Result<()> {
        out.clear();
        out.extend_from_slice(&a.data);
        Ok(())
    }

    fn get_rows(&self, table: &CpuMatrix, tokens: &[u32], out: &mut CpuAct) -> Result<()> {
        check(out, tokens.len(), table.m.cols, "get_rows")?;
        let rb = table.m.row_bytes();
        let bytes = table.bytes();
        for (i, &t) in tokens.iter().enumerate() {
            let t = t as usize;
            if t >= table.m.rows {
                return Err(Error::Input(format!(
                    "token id {t} is outside the vocabulary (size {})",
                    table.m.rows
                )));
            }
            let dst = &mut out.data[i * table.m.cols..(i + 1) * table.m.cols];
            match self.mode {
                NumericMode::Accurate | NumericMode::CudaParity => {
                    formats::dequantize_row(table.m.ty, &bytes[t * rb..(t + 1) * rb], dst)
                }
                NumericMode::Parity => ggml::get_row(table.m.ty, &bytes[t * rb..(t + 1) * rb], dst),
            }
        }
        Ok(())
    }

    fn rms_norm(&self, x: &CpuAct, w: Option<&Vec<f32>>, eps: f32, out: &mut CpuAct) -> Result<()> {
        check(out, x.rows, x.cols, "rms_norm")?;
        if let Some(w) = w {
            if w.len() != x.cols {
                return Err(Error::Backend(format!(
                    "rms_norm weight of {} for rows of {}",
                    w.len(),
                    x.cols
                )));
            }
        }
        match self.mode {
            NumericMode::Accurate | NumericMode::CudaParity => self.install(|| {
                out.data
                    .par_chunks_mut(x.cols)
                    .zip(x.data.par_chunks(x.cols))
                    .for_each(|(o, r)| {
                        ops::rms_norm_row(r, w.map(|v| v.as_slice()), eps, o);
                    })
            }),
            NumericMode::Parity => self.install(|| {
                out.data
                    .par_chunks_mut(x.cols)
                    .zip(x.data.par_chunks(x.cols))
                    .for_each(|(o, r)| match w {
                        Some(w) => ggml::rms_norm_mul(r, w, eps, o),
                        None => ggml::rms_norm(r, eps, o),
                    })
            }),
        }
        Ok(())
    }

    fn matmul(&self, w: &CpuMatrix, x: &CpuAct, out: &mut CpuAct) -> Result<()> {
        if x.cols != w.m.cols {
            return Err(Error::Backend(format!(
                "matmul {}: input width {}, expected {}",
                w.m.name, x.cols, w.m.cols
            )));
        }
        check(out, x.rows, w.m.rows, "matmul")?;
        let product = match self.mode {
            NumericMode::Accurate => matmul::matmul,
            NumericMode::Parity => ggml::mul_mat,
            NumericMode::CudaParity => cuda_anchor::mul_mat,
        };
        self.install(|| {
            product(
                w.m.ty,
                w.bytes(),
                w.m.rows,
                w.m.cols,
                &x.data,
                x.rows,
                &mut out.data,
            )
        });
        Ok(())
    }

    fn head_norm(&self, x: &mut CpuAct, head_dim: usize, eps: f32, scale: f32) -> Result<()> {
        match self.mode {
            NumericMode::Accurate | NumericMode::CudaParity => self.install(|| {
                x.data
                    .par_chunks_mut(x.cols)
                    .for_each(|r| ops::head_norm_row(r, head_dim, eps, scale))
            }),
            NumericMode::Parity => {
                // QK-norm is build_norm with the (constant) q_norm / k_norm tensor as weight.
                let w = vec![scale; head_dim];
                ggml::rms_norm_rows(&mut x.data, head_dim, Some(&w), eps)
            }
        }
        Ok(())
    }

    fn rope(&self, x: &mut CpuAct, head_dim: usize, batch: &Batch, freq_base: f32) -> Result<()> {
        check(x, batch.len(), x.cols, "rope")?;
        match self.mode {
            NumericMode::Accurate | NumericMode::CudaParity => self.install(|| {
                x.data
                    .par_chunks_mut(x.cols)
                    .zip(batch.pos.par_iter())
                    .for_each(|(r, &p)| {
                        ops::rope_row(r, head_dim, &ops::rope_table(p, head_dim, freq_base))
                    })
            }),
            NumericMode::Parity => self.install(|| {
                x.data
                    .par_chunks_mut(x.cols)
                    .zip(batch.pos.par_iter())
                    .for_each(|(r, &p)| ggml::rope_norm(r, head_dim, p as i32, freq_base))
            }),
        }
        Ok(())
    }

    fn attention(
        &self,
        caches: &mut [&mut HostKv],
        spec: AttnSpec,
        batch: &Batch,
        q: &CpuAct,
        k: &CpuAct,
        v: &CpuAct,
        out: &mut CpuAct,
    ) -> Result<()> {
        check(q, batch.len(), spec.n_head * spec.head_dim, "attention q")?;
        check(
            k,
            batch.len(),
            spec.n_head_kv * spec.head_dim,
            "attention k",
        )?;
        check(
            v,
            batch.len(),
            spec.n_head_kv * spec.head_dim,
            "attention v",
        )?;
        check(
            out,
            batch.len(),
            spec.n_head * spec.head_dim,
            "attention out",
        )?;
        match self.mode {
            NumericMode::Accurate | NumericMode::CudaParity => self.install(|| {
                attention::attention(
                    caches,
                    spec,
                    batch,
                    &q.data,
                    &k.data,
                    &v.data,
                    &mut out.data,
                )
            }),
            NumericMode::Parity => {
                if caches.len() != 1 || batch.seq.iter().any(|&s| s != 0) {
                    return Err(Error::Backend(
                        "parity mode reproduces llama.cpp with one sequence".into(),
                    ));
                }
                self.install(|| {
                    parity::attention(
                        caches[0],
                        spec,
                        batch,
                        &q.data,
                        &k.data,
                        &v.data,
                        &mut out.data,
                    )
                })
            }
        }
    }

    fn sigmoid_gate(&self, x: &mut CpuAct, g: &CpuAct) -> Result<()> {
        check(g, x.rows, x.cols, "sigmoid_gate")?;
        match self.mode {
            NumericMode::Accurate | NumericMode::CudaParity => self.install(|| {
                x.data
                    .par_chunks_mut(x.cols)
                    .zip(g.data.par_chunks(x.cols))
                    .for_each(|(a, b)| ops::sigmoid_gate_row(a, b))
            }),
            NumericMode::Parity => {
                // gate = ggml_sigmoid(gate); cur = ggml_mul(cur, gate)
                let mut sg = g.data.clone();
                ggml::sigmoid(&mut sg);
                ggml::mul(&mut x.data, &sg);
            }
        }
        Ok(())
    }

    fn swiglu(&self, gate: &CpuAct, up: &CpuAct, out: &mut CpuAct) -> Result<()> {
        check(up, gate.rows, gate.cols, "swiglu")?;
        check(out, gate.rows, gate.cols, "swiglu")?;
        let row: fn(&[f32], &[f32], &mut [f32]) = match self.mode {
            NumericMode::Accurate | NumericMode::CudaParity => ops::swiglu_row,
            NumericMode::Parity => ggml::swiglu_row,
        };
        self.install(|| {
            out.data
                .par_chunks_mut(gate.cols)
                .zip(
                    gate.data
                        .par_chunks(gate.cols)
                        .zip(up.data.par_chunks(gate.cols)),
                )
                .for_each(|(o, (g, u))| row(g, u, o))
        });
        Ok(())
    }

    fn post_norm_add(
        &self,
        resid: &mut CpuAct,
        src: &CpuAct,
        w: &Vec<f32>,
        eps: f32,
    ) -> Result<()> {
        check(src, resid.rows, resid.cols, "post_norm_add")?;
        match self.mode {
            NumericMode::Accurate | NumericMode::CudaParity => self.install(|| {
                let cols = resid.cols;
                resid
                    .data
                    .par_chunks_mut(cols)
                    .zip(src.data.par_chunks(cols))
                    .for_each(|(r, s)| {
                        let mut tmp = vec![0f32; cols];
                        ops::rms_norm_row(s, Some(w), eps, &mut tmp);
                        for (a, b) in r.iter_mut().zip(&tmp) {
                            *a += *b;
                        }
                    })
            }),
            NumericMode::Parity => self.install(|| {
                // cur = ggml_mul(ggml_rms_norm(src, eps), w); resid = ggml_add(cur, resid)
                let cols = resid.cols;
                resid
                    .data
                    .par_chunks_mut(cols)
                    .zip(src.data.par_chunks(cols))
                    .for_each(|(r, s)| {
                        let mut tmp = vec![0f32; cols];
                        ggml::rms_norm_mul(s, w, eps, &mut tmp);
                        ggml::add(r, &tmp);
                    })
            }),
        }
        Ok(())
    }

    fn logit_finish(&self, x: &mut CpuAct, scale: f32, softcap: Option<f32>) -> Result<()> {
        match self.mode {
            NumericMode::Accurate | NumericMode::CudaParity => self.install(|| {
                x.data
                    .par_chunks_mut(x.cols)
                    .for_each(|r| ops::logit_finish_row(r, scale, softcap))
            }),
            NumericMode::Parity => {
                ggml::scale(&mut x.data, scale);
                if let Some(c) = softcap {
                    ggml::softcap(&mut x.data, c);
                }
            }
        }
        Ok(())
    }

    fn select_rows(&self, x: &CpuAct, rows: &[usize], out: &mut CpuAct) -> Result<()> {
        check(out, rows.len(), x.cols, "select_rows")?;
        for (i, &r) in rows.iter().enumerate() {
            if r >= x.rows {
                return Err(Error::Backend(format!(
                    "select_rows: row {r} of {}",
                    x.rows
                )));
            }
            out.data[i * x.cols..(i + 1) * x.cols].copy_from_slice(x.row(r));
        }
        Ok(())
    }
}
