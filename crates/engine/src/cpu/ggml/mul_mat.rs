//! `GGML_OP_MUL_MAT` as ggml-cpu computes it (ggml-cpu.c:1255 `ggml_compute_forward_mul_mat`) for a
//! contiguous weight `W` (src0: `ne00 = cols`, `ne01 = rows`) and a contiguous f32 input `x`
//! (src1: `ne10 = cols`, `ne11 = n_tokens`), without weight repacking.
//!
//! Routing, in ggml's order (see docs/PARITY.md, "mul_mat routing"):
//! 1. tiled K-quant path (tiled/tiled.cpp:1209): Q4_K / Q5_K / Q6_K with `n_tokens >= 8`;
//! 2. llamafile_sgemm on the f32 input (sgemm.cpp:3896): F32 weights, `n_tokens >= 2`,
//!    `rows % 4 == 0`;
//! 3. src1 converted to the `vec_dot_type` (Q8_K, Q8_0, F16, BF16), then llamafile_sgemm again:
//!    F16 / BF16 weights (`n_tokens >= 2`, `rows % 4 == 0`) and Q8_0 / Q4_0 (`n_tokens >= 2`);
//! 4. otherwise `vec_dot` per (row, token).
//! Q8_0 / Q4_0 give the same bits through tinyBLAS_Q0_AVX and `vec_dot`, so they share a kernel.

use muser_gguf::GgmlType;
use rayon::prelude::*;

use super::lanes::with_avx2_fma;
use super::quantize::{
    BlockQ8K, Q8_0_BYTES, QK_K, QK8_0, quantize_row_bf16, quantize_row_f16, quantize_row_q8_0,
    quantize_row_q8_k,
};
use super::sgemm::{sgemm_dot_bf16, sgemm_dot_f16, sgemm_dot_f32};
use super::tiled::tiled_dot_k;
use super::vec_dot::{
    KBlock, OutLayout, TiledSums, tiled_rows_k_packed_with, vec_dot_bf16, vec_dot_f16, vec_dot_f32,
    vec_dot_k, vec_dot_k_packed, vec_dot_q0_q8_0,
};

/// Which ggml-cpu kernel computes a mul_mat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatMulPath {
    /// `type_traits_cpu[ty].vec_dot` per output element.
    VecDot,
    /// llamafile_sgemm's tinyBLAS (f32/f16/bf16) or tinyBLAS_Q0_AVX (q8_0/q4_0).
    Sgemm,
    /// The tiled K-quant kernel.
    Tiled,
}

/// The path ggml-cpu b11434 (AVX2 build, no repack, llamafile on, tiled on) takes for a weight of
/// type `ty` with `rows` output rows and a contiguous f32 input of `n_tokens` columns.
pub fn mul_mat_path(ty: GgmlType, rows: usize, n_tokens: usize) -> MatMulPath {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K if n_tokens >= 8 => MatMulPath::Tiled,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 if n_tokens >= 2 && rows % 4 == 0 => {
            MatMulPath::Sgemm
        }
        GgmlType::Q8_0 | GgmlType::Q4_0 if n_tokens >= 2 => MatMulPath::Sgemm,
        _ => MatMulPath::VecDot,
    }
}

/// A matmul input converted to a weight type's `vec_dot_type`, as ggml-cpu converts src1 into its
/// work buffer. Build it once and reuse it for every weight that reads the same input (Q/K/V/gate,
/// ffn gate/up) with [`mul_mat_act`].
pub enum Activations {
    F32 {
        x: Vec<f32>,
        cols: usize,
    },
    F16 {
        x: Vec<u16>,
        cols: usize,
    },
    BF16 {
        x: Vec<u16>,
        cols: usize,
    },
    /// Q8_0 blocks in ggml's byte layout.
    Q8_0 {
        x: Vec<u8>,
        cols: usize,
    },
    Q8K {
        x: Vec<BlockQ8K>,
        cols: usize,
    },
}

/// The `vec_dot_type` of a weight type (ggml-cpu.c `type_traits_cpu`).
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    match ty {
        GgmlType::F32 => GgmlType::F32,
        GgmlType::F16 => GgmlType::F16,
        GgmlType::BF16 => GgmlType::BF16,
        GgmlType::Q8_0 | GgmlType::Q4_0 => GgmlType::Q8_0,
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => GgmlType::Q8_K,
        other => panic!("ggml parity: no vec_dot for weight type {other}"),
    }
}

impl Activations {
    /// Convert `n_tokens` rows of `cols` f32 values for weights of type `ty`.
    pub fn new(ty: GgmlType, x: &[f32], cols: usize, n_tokens: usize) -> Activations {
        assert_eq!(
            x.len(),
            cols * n_tokens,
            "Activations::new: {} values for {n_tokens} x {cols}",
            x.len()
        );
        match vec_dot_type(ty) {
            GgmlType::F32 => Activations::F32 {
                x: x.to_vec(),
                cols,
            },
            GgmlType::F16 => {
                let mut v = vec![0u16; x.len()];
                quantize_row_f16(x, &mut v);
                Activations::F16 { x: v, cols }
            }
            GgmlType::BF16 => {
                let mut v = vec![0u16; x.len()];
                quantize_row_bf16(x, &mut v);
                Activations::BF16 { x: v, cols }
            }
            GgmlType::Q8_0 => {
                assert_eq!(
                    cols % QK8_0,
                    0,
                    "Q8_0 input: cols {cols} not a multiple of 32"
                );
                let rb = cols / QK8_0 * Q8_0_BYTES;
                let mut v = vec![0u8; rb * n_tokens];
                v.par_chunks_mut(rb)
                    .zip(x.par_chunks(cols))
                    .for_each(|(o, r)| quantize_row_q8_0(r, o));
                Activations::Q8_0 { x: v, cols }
            }
            GgmlType::Q8_K => {
                assert_eq!(
                    cols % QK_K,
                    0,
                    "Q8_K input: cols {cols} not a multiple of 256"
                );
                let nb = cols / QK_K;
                let mut v = vec![BlockQ8K::ZERO; nb * n_tokens];
                v.par_chunks_mut(nb)
                    .zip(x.par_chunks(cols))
                    .for_each(|(o, r)| quantize_row_q8_k(r, o));
                Activations::Q8K { x: v, cols }
            }
            _ => unreachable!(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Activations::F32 { cols, .. }
            | Activations::F16 { cols, .. }
            | Activations::BF16 { cols, .. }
            | Activations::Q8_0 { cols, .. }
            | Activations::Q8K { cols, .. } => *cols,
        }
    }

    pub fn n_tokens(&self) -> usize {
        let c = self.cols();
        match self {
            Activations::F32 { x, .. } => x.len() / c,
            Activations::F16 { x, .. } | Activations::BF16 { x, .. } => x.len() / c,
            Activations::Q8_0 { x, .. } => x.len() / (c / QK8_0 * Q8_0_BYTES),
            Activations::Q8K { x, .. } => x.len() / (c / QK_K),
        }
    }
}

/// Scratch for one chunk of rows: a weight row widened to f32 / u16.
struct RowBuf {
    f: Vec<f32>,
    h: Vec<u16>,
    k: Vec<KBlock>,
}

/// One output element: weight row `w` (raw bytes of `ty`) against input token `t`.
#[inline(always)]
fn dot(
    ty: GgmlType,
    path: MatMulPath,
    w: &[u8],
    act: &Activations,
    t: usize,
    buf: &mut RowBuf,
    new_row: bool,
) -> f32 {
    let cols = act.cols();
    match (act, ty) {
        (Activations::F32 { x, .. }, GgmlType::F32) => {
            if new_row {
                for (d, c) in buf.f.iter_mut().zip(w.chunks_exact(4)) {
                    *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            let xr = &x[t * cols..(t + 1) * cols];
            if path == MatMulPath::Sgemm {
                sgemm_dot_f32(&buf.f, xr)
            } else {
                vec_dot_f32(&buf.f, xr)
            }
        }
        (
            Activations::F16 { x, .. } | Activations::BF16 { x, .. },
            GgmlType::F16 | GgmlType::BF16,
        ) => {
            if new_row {
                for (d, c) in buf.h.iter_mut().zip(w.chunks_exact(2)) {
                    *d = u16::from_le_bytes([c[0], c[1]]);
                }
            }
            let xr = &x[t * cols..(t + 1) * cols];
            match (ty, path) {
                (GgmlType::F16, MatMulPath::Sgemm) => sgemm_dot_f16(&buf.h, xr),
                (GgmlType::F16, _) => vec_dot_f16(&buf.h, xr),
                (_, MatMulPath::Sgemm) => sgemm_dot_bf16(&buf.h, xr),
                _ => vec_dot_bf16(&buf.h, xr),
            }
        }
        (Activations::Q8_0 { x, .. }, GgmlType::Q8_0 | GgmlType::Q4_0) => {
            let rb = cols / QK8_0 * Q8_0_BYTES;
            vec_dot_q0_q8_0(ty == GgmlType::Q4_0, w, &x[t * rb..(t + 1) * rb])
        }
        (Activations::Q8K { x, .. }, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K) => {
            let nb = cols / QK_K;
            let y = &x[t * nb..(t + 1) * nb];
            // Fewer than 8 tokens: straight from the row's bytes (the same bits; the row, read
            // once per token, stays in the cache between them).
            if path == MatMulPath::VecDot
                && let Some(v) = vec_dot_k_packed(ty, w, y)
            {
                return v;
            }
            if new_row {
                // decode the weight row once for all input columns
                let bs = ty.type_size();
                buf.k.resize(w.len() / bs, KBlock::ZERO);
                for (xb, b) in w.chunks_exact(bs).zip(buf.k.iter_mut()) {
                    KBlock::decode(ty, xb, b);
                }
            }
            if path == MatMulPath::Tiled {
                tiled_dot_k(ty, &buf.k, y)
            } else {
                vec_dot_k(ty, &buf.k, y)
            }
        }
        _ => panic!("ggml parity: activations do not match weight type {ty}"),
    }
}

/// `y[t*rows + r] = W[r] · x[t]` exactly as ggml-cpu's GGML_OP_MUL_MAT (see the module docs).
/// `w` is `rows` rows of `cols` values of `ty` in ggml's layout; `x` is `n_tokens` rows of `cols`.
/// Parallel over rows (rayon); the result does not depend on the thread count.
pub fn mul_mat(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) {
    let act = Activations::new(ty, x, cols, n_tokens);
    mul_mat_act(ty, w, rows, &act, y);
}

/// [`mul_mat`] on an input already converted with [`Activations::new`] for `ty`.
pub fn mul_mat_act(ty: GgmlType, w: &[u8], rows: usize, act: &Activations, y: &mut [f32]) {
    let cols = act.cols();
    let n_tokens = act.n_tokens();
    let rb = ty
        .row_bytes(cols as u64)
        .expect("ggml parity: cols not a multiple of the block size") as usize;
    assert_eq!(
        w.len(),
        rb * rows,
        "mul_mat: weight is {} bytes, expected {rows} rows of {rb}",
        w.len()
    );
    assert_eq!(
        y.len(),
        rows * n_tokens,
        "mul_mat: output has {} values, expected {rows} x {n_tokens}",
        y.len()
    );
    let path = mul_mat_path(ty, rows, n_tokens);

    // rows in chunks; each chunk computes [n_tokens][chunk rows], then each token's run goes to y[t]
    const CHUNK: usize = 16;
    // The tiled kernel's token sums, arranged once for every chunk.
    let sums = match act {
        Activations::Q8K { x, .. } if path == MatMulPath::Tiled => TiledSums::new(ty, x, n_tokens),
        _ => None,
    };
    let dst = OutRows {
        ptr: y.as_mut_ptr(),
        rows,
        n_tokens,
        _y: std::marker::PhantomData,
    };
    (0..rows.div_ceil(CHUNK)).into_par_iter().for_each(|c| {
        let r0 = c * CHUNK;
        // The chunk's outputs, [token][row], then each token's run into y.
        let mut out = vec![0.0f32; (rows - r0).min(CHUNK) * n_tokens];
        let out = &mut out[..];
        // Only the widened row this type reads (a K-quant row reads none).
        let mut buf = RowBuf {
            f: if ty == GgmlType::F32 {
                vec![0.0; cols]
            } else {
                Vec::new()
            },
            h: if matches!(ty, GgmlType::F16 | GgmlType::BF16) {
                vec![0; cols]
            } else {
                Vec::new()
            },
            k: Vec::new(),
        };
        with_avx2_fma(
            #[inline(always)]
            || {
                // 8 tokens or more of a K-quant: the tiled kernel's arithmetic from the
                // rows' bytes, each of the chunk's rows decoded once for all the tokens.
                let rows_here = out.len() / n_tokens;
                let done = sums.as_ref().is_some_and(|sums| match act {
                    Activations::Q8K { x, .. } => tiled_rows_k_packed_with(
                        sums,
                        &w[r0 * rb..(r0 + rows_here) * rb],
                        rb,
                        x,
                        out,
                        OutLayout::TokenRow,
                    ),
                    _ => false,
                });
                if !done {
                    for i in 0..rows_here {
                        let wr = &w[(r0 + i) * rb..(r0 + i + 1) * rb];
                        for t in 0..n_tokens {
                            out[t * rows_here + i] = dot(ty, path, wr, act, t, &mut buf, t == 0);
                        }
                    }
                }
            },
        );
        dst.put(r0, out);
    });
}

/// `y` of [`mul_mat_act`] (`[token][row]`), written by the row chunks in parallel, each into its
/// own columns. (A [row][token] buffer scattered into y on one thread afterwards took 8% of a
/// prompt's time; one [token][row] buffer copied afterwards, 5%.)
struct OutRows<'a> {
    ptr: *mut f32,
    rows: usize,
    n_tokens: usize,
    /// The `&mut y` the pointer comes from, held for as long as `OutRows` lives.
    _y: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: `OutRows` is only a way for the chunk tasks of one `mul_mat_act` call to write their
// disjoint parts of `y` (see `put`); the `&mut y` it was made from is not used while they run.
unsafe impl Sync for OutRows<'_> {}

impl OutRows<'_> {
    /// Rows `r0..r0 + out.len() / n_tokens` of every token from `out` (`[token][row]`).
    fn put(&self, r0: usize, out: &[f32]) {
        if self.n_tokens == 0 {
            return;
        }
        let here = out.len() / self.n_tokens;
        assert!(
            here * self.n_tokens == out.len() && r0 + here <= self.rows,
            "mul_mat: chunk rows"
        );
        for (t, src) in out.chunks_exact(here).enumerate() {
            // SAFETY: in bounds: t < n_tokens and r0 + here <= rows, and y holds rows *
            // n_tokens values (asserted by `mul_mat_act`). Disjoint: each chunk task has its
            // own r0 (multiples of CHUNK, `here` <= CHUNK), so no two tasks write the same
            // element, and nothing reads y until every task has finished (`for_each` returns
            // after all of them).
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(t * self.rows + r0), here)
            };
        }
    }
}
