//! llama.cpp b11434's CUDA one-token products, modelled on the CPU (numeric mode `cuda-parity`).
//!
//! What moves llama.cpp's CUDA results away from an exact product, and so what a backend must
//! reproduce to agree with it (docs/PARITY.md, "The CUDA anchor"):
//! - quantized weights (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K) multiply activations quantized to q8_1
//!   (`quantize_q8_1`, ggml-cuda/quantize.cu:55): blocks of 32, `d = amax / 127`, `q =
//!   roundf(x / d)`, the scale and the block's float sum stored as f16 and read back from f16;
//!   the products are integer dot products combined per block in f32 (vecdotq.cuh) by the
//!   thread split of `mul_mat_vec_q` (mmvq.cu:715-803: 4 warps, one f32 sum per thread, the
//!   warps added in order into warp 0, then a butterfly);
//! - F16 weights (`mul_mat_vec_f`, mmvf.cu:192-222) accumulate in f16: each thread sums the
//!   products of its (even, odd) pairs in a half2, the activations rounded to f16, then the two
//!   halves in f32 and the block's butterflies (mmvf.cu:300-345).
//!
//! Everything else (norms, RoPE, attention, BF16/F32 products) stays in the accurate mode: those
//! differ from llama.cpp's CUDA arithmetic by float rounding only (fast-math intrinsics, other
//! sum orders), which the fixtures measure well below 1e-3 (docs/PARITY.md). The float order of
//! the integer blocks' combination is reproduced; `-use_fast_math`'s approximate division in
//! `x / d` (a reciprocal to 1 ulp) is modelled as an exact division (a quantum can round the
//! other way when `x / d` lies within an ulp of a half-integer), and the multiply-adds nvcc may
//! fuse in the block formulas (`sumf_d += d8 * ...`, `tmp += vec_dot(...)`) are rounded
//! separately here: not read off llama.cpp's SASS yet, an f32 rounding either way.

use half::f16;
use muser_gguf::GgmlType;

use super::matmul;
use crate::formats::{f16_at, scale_min_k4};

/// Threads of `mul_mat_vec_q` (4 warps of 32) and the warp size.
const MMVQ_THREADS: usize = 128;
const WARP: usize = 32;

/// Whether this module computes products of `ty` (the others go to the accurate products).
pub fn models(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0
            | GgmlType::Q8_0
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::F16
    )
}

/// One activation row quantized as ggml-cuda's q8_1 (padded with zeros to a multiple of 32).
pub struct Q8_1 {
    pub q: Vec<i8>,
    /// Per block of 32: the scale and the sum of the block's floats, each as read from f16.
    pub d: Vec<f32>,
    pub s: Vec<f32>,
}

/// The XOR butterfly of `warp_reduce_sum<32>` (ggml-cuda/common.cuh:468): lane 0's result.
fn butterfly(mut v: [f32; WARP]) -> f32 {
    let mut off = WARP / 2;
    while off > 0 {
        let t = v;
        for (i, x) in v.iter_mut().enumerate() {
            *x = t[i] + t[i ^ off];
        }
        off /= 2;
    }
    v[0]
}

pub fn quantize_q8_1(x: &[f32]) -> Q8_1 {
    let nb = x.len().div_ceil(32);
    let mut out = Q8_1 {
        q: vec![0; nb * 32],
        d: vec![0.0; nb],
        s: vec![0.0; nb],
    };
    for b in 0..nb {
        let mut v = [0f32; WARP];
        for (i, vi) in v.iter_mut().enumerate() {
            *vi = x.get(32 * b + i).copied().unwrap_or(0.0);
        }
        let amax = v.iter().fold(0f32, |m, &a| m.max(a.abs()));
        let sum = butterfly(v);
        let d = amax / 127.0;
        for (i, &vi) in v.iter().enumerate() {
            out.q[32 * b + i] = if amax == 0.0 {
                0
            } else {
                (vi / d).round() as i8
            };
        }
        out.d[b] = f16::from_f32(d).to_f32();
        out.s[b] = f16::from_f32(sum).to_f32();
    }
    out
}

/// `__dp4a`: four signed byte products added to `c`.
fn dp4a(a: [i8; 4], b: [i8; 4], c: i32) -> i32 {
    (0..4).fold(c, |s, k| s + a[k] as i32 * b[k] as i32)
}

fn bytes4(v: u32) -> [i8; 4] {
    v.to_le_bytes().map(|b| b as i8)
}

fn int_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// 4 values of the q8_1 row from value `at` on, as a `dp4a` operand.
fn u4(y: &Q8_1, at: usize) -> [i8; 4] {
    [y.q[at], y.q[at + 1], y.q[at + 2], y.q[at + 3]]
}

/// `(qk, qi, vdr)` of a quantized type in mmvq (ggml-common.h, vecdotq.cuh VDR_*_MMVQ).
fn mmvq_shape(ty: GgmlType) -> (usize, usize, usize) {
    match ty {
        GgmlType::Q4_0 => (32, 4, 2),
        GgmlType::Q8_0 => (32, 8, 2),
        GgmlType::Q6_K => (256, 32, 1),
        _ => (256, 32, 2), // Q4_K, Q5_K
    }
}

/// `vec_dot_<ty>_q8_1` of block `kbx` of `row` with the q8_1 activations, quant index `iqs`.
fn vec_dot(ty: GgmlType, row: &[u8], kbx: usize, y: &Q8_1, iqs: usize) -> f32 {
    match ty {
        GgmlType::Q4_0 => {
            let b = &row[18 * kbx..18 * kbx + 18];
            let (d4, qs) = (f16_at(b, 0), &b[2..]);
            let base = 32 * kbx;
            let mut sumi = 0;
            for i in 0..2 {
                let v = int_at(qs, iqs + i);
                sumi = dp4a(bytes4(v & 0x0F0F_0F0F), u4(y, base + 4 * (iqs + i)), sumi);
                sumi = dp4a(
                    bytes4((v >> 4) & 0x0F0F_0F0F),
                    u4(y, base + 4 * (iqs + i + 4)),
                    sumi,
                );
            }
            let (d8, s8) = (y.d[kbx], y.s[kbx]);
            d4 * (sumi as f32 * d8 - 4.0 * s8)
        }
        GgmlType::Q8_0 => {
            let b = &row[34 * kbx..34 * kbx + 34];
            let (d, qs) = (f16_at(b, 0), &b[2..]);
            let base = 32 * kbx;
            let mut sumi = 0;
            for i in 0..2 {
                sumi = dp4a(
                    bytes4(int_at(qs, iqs + i)),
                    u4(y, base + 4 * (iqs + i)),
                    sumi,
                );
            }
            d * y.d[kbx] * sumi as f32
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let q5 = ty == GgmlType::Q5_K;
            let size = if q5 { 176 } else { 144 };
            let b = &row[size * kbx..size * (kbx + 1)];
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let scales = &b[4..16];
            let (qh, qs) = if q5 {
                (&b[16..48], &b[48..176])
            } else {
                (&b[0..0], &b[16..144])
            };
            let bq8 = 2 * ((iqs / 2) / 4);
            let t = (iqs / 2) % 4;
            let ql = |k: usize| int_at(&qs[16 * bq8 + 4 * t..], 4 * k);
            let vh = |k: usize| {
                if q5 {
                    int_at(&qh[4 * t..], 4 * k) >> bq8
                } else {
                    0
                }
            };
            let (mut sumf_d, mut sumf_m) = (0f32, 0f32);
            for i in 0..2 {
                let sub = bq8 + i;
                let (sc, m) = scale_min_k4(sub, scales);
                let base = 256 * kbx + 32 * sub;
                let v = |k: usize| {
                    ((ql(k) >> (4 * i)) & 0x0F0F_0F0F) | (((vh(k) >> i) << 4) & 0x1010_1010)
                };
                let (u0, u1) = (u4(y, base + 4 * t), u4(y, base + 16 + 4 * t));
                let dot1 = dp4a(bytes4(v(1)), u1, dp4a(bytes4(v(0)), u0, 0));
                let dot2 = dp4a([1; 4], u1, dp4a([1; 4], u0, 0));
                let d8 = y.d[8 * kbx + sub];
                sumf_d += d8 * (dot1 * sc as i32) as f32;
                sumf_m += d8 * (dot2 * m as i32) as f32;
            }
            d * sumf_d - dmin * sumf_m
        }
        GgmlType::Q6_K => {
            let b = &row[210 * kbx..210 * kbx + 210];
            let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
            let d = f16_at(b, 208);
            let bq8 = 4 * (iqs / 16) + (iqs % 16) / 8;
            let scale_offset = 8 * (iqs / 16) + (iqs % 16) / 4;
            let vh_shift = 2 * ((iqs % 16) / 8);
            let vl = int_at(ql, iqs);
            let vh = int_at(qh, 8 * (iqs / 16) + iqs % 8) >> vh_shift;
            let mut sumf = 0f32;
            for i in 0..2 {
                let s = sc[scale_offset + 4 * i] as i8 as i32;
                let vil = (vl >> (4 * i)) & 0x0F0F_0F0F;
                let vih = ((vh >> (4 * i)) << 4) & 0x3030_3030;
                let vi = bytes4(vil | vih).map(|q| q.wrapping_sub(32));
                let blk = 8 * kbx + bq8 + 2 * i;
                let u = u4(y, 32 * blk + 4 * (iqs % 8));
                sumf += y.d[blk] * (dp4a(vi, u, 0) * s) as f32;
            }
            d * sumf
        }
        _ => unreachable!("models() admits only the types above"),
    }
}

/// One row of `mul_mat_vec_q`: each of 128 threads sums its blocks in increasing order, warps
/// 1..3 are added to warp 0 lane by lane in order, then the butterfly.
fn mmvq_row(ty: GgmlType, row: &[u8], nblocks: usize, y: &Q8_1) -> f32 {
    let (_, qi, vdr) = mmvq_shape(ty);
    let per_block = qi / vdr;
    let per_iter = vdr * MMVQ_THREADS / qi;
    let mut tmp = [0f32; MMVQ_THREADS];
    for (tid, t) in tmp.iter_mut().enumerate() {
        let mut kbx = tid / per_block;
        while kbx < nblocks {
            *t += vec_dot(ty, row, kbx, y, vdr * (tid % per_block));
            kbx += per_iter;
        }
    }
    let mut lanes = [0f32; WARP];
    for (lane, l) in lanes.iter_mut().enumerate() {
        let mut s = tmp[lane];
        for w in 1..MMVQ_THREADS / WARP {
            s += tmp[WARP * w + lane];
        }
        *l = s;
    }
    butterfly(lanes)
}

/// `mul_mat_vec_f`'s block size for `cols` (mmvf.cu:437-450): the multiple of 32 up to 256 with
/// the fewest iterations over the column pairs, the smallest among equals.
pub fn mmvf_block(cols: usize) -> usize {
    let (mut best, mut niter) = (WARP, cols.div_ceil(2 * WARP));
    let mut bs = 2 * WARP;
    while bs <= 256 {
        let n = cols.div_ceil(2 * bs);
        if n < niter {
            (best, niter) = (bs, n);
        }
        bs += WARP;
    }
    best
}

/// One row of F16 weights by `mul_mat_vec_f` with half2 sums: `acc = fma(w, f16(y), acc)` in f16
/// per lane of the pair (one rounding: the product of two f16 is exact in f64, as is its sum
/// with an f16), the halves added in f32, then the warp butterflies.
fn mmvf_f16_row(row: &[u8], y16: &[f16], cols: usize) -> f32 {
    let bs = mmvf_block(cols);
    let pairs = cols / 2;
    let mut sums = vec![0f32; bs];
    for (tid, s) in sums.iter_mut().enumerate() {
        let (mut lo, mut hi) = (f16::ZERO, f16::ZERO);
        let mut c2 = tid;
        while c2 < pairs {
            let (w0, w1) = (f16_at(row, 4 * c2) as f64, f16_at(row, 4 * c2 + 2) as f64);
            lo = f16::from_f64(w0 * y16[2 * c2].to_f64() + lo.to_f64());
            hi = f16::from_f64(w1 * y16[2 * c2 + 1].to_f64() + hi.to_f64());
            c2 += bs;
        }
        *s = lo.to_f32() + hi.to_f32();
    }
    let warps: Vec<f32> = sums
        .chunks(WARP)
        .map(|w| {
            let mut v = [0f32; WARP];
            v[..w.len()].copy_from_slice(w);
            butterfly(v)
        })
        .collect();
    if bs == WARP {
        return warps[0];
    }
    let mut v = [0f32; WARP];
    v[..warps.len()].copy_from_slice(&warps);
    butterfly(v)
}

/// `y[t] = W x[t]` for every token, as llama.cpp's CUDA build computes one token (the same
/// signature as the accurate `matmul::matmul`, which takes the types this module does not model
/// and odd shapes).
pub fn mul_mat(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) {
    use rayon::prelude::*;
    let row_bytes = w.len() / rows.max(1);
    let (qk, _, _) = mmvq_shape(ty);
    let shaped = models(ty)
        && if ty == GgmlType::F16 {
            cols.is_multiple_of(2)
        } else {
            cols.is_multiple_of(qk)
        };
    if !shaped {
        matmul::matmul(ty, w, rows, cols, x, n_tokens, y);
        return;
    }
    for (xt, yt) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)) {
        if ty == GgmlType::F16 {
            let y16: Vec<f16> = xt.iter().map(|&v| f16::from_f32(v)).collect();
            yt.par_iter_mut().enumerate().for_each(|(r, o)| {
                *o = mmvf_f16_row(&w[r * row_bytes..(r + 1) * row_bytes], &y16, cols)
            });
        } else {
            let q = quantize_q8_1(xt);
            yt.par_iter_mut().enumerate().for_each(|(r, o)| {
                *o = mmvq_row(ty, &w[r * row_bytes..(r + 1) * row_bytes], cols / qk, &q)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_1_blocks_round_half_away_and_keep_f16_scales() {
        let mut x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.37).collect();
        x[40..].iter_mut().for_each(|v| *v = 0.0);
        let q = quantize_q8_1(&x);
        let amax = x[..32].iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(q.d[0], f16::from_f32(amax / 127.0).to_f32());
        assert!(q.q[..32].iter().any(|&v| v == 127 || v == -127));
        for i in 0..32 {
            assert_eq!(q.q[i], (x[i] / (amax / 127.0)).round() as i8);
        }
        // A block of zeros has scale 0 and quanta 0; a partly zero block quantizes as usual.
        assert_eq!(quantize_q8_1(&[0.0; 32]).d[0], 0.0);
        assert!(q.q[40..].iter().all(|&v| v == 0));
    }

    #[test]
    fn mmvf_block_sizes_follow_ggml_cuda() {
        assert_eq!(mmvf_block(64), 32);
        assert_eq!(mmvf_block(256), 128);
        assert_eq!(mmvf_block(5120), 256);
        assert_eq!(mmvf_block(128), 64);
    }

    /// With activations already on the q8_1 grid (and f16 scales exact), each modelled product
    /// equals the exact dequantized product up to f32 rounding: the block formulas and the
    /// thread split cover every value once.
    #[test]
    fn modelled_products_cover_every_value_once() {
        use crate::formats::dequantize_row;
        let cols = 512;
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let bs = ty.type_size();
            let nb = cols / ty.block_size();
            // Random-looking bytes with sane (small, positive) f16 scales.
            let mut w: Vec<u8> = (0..bs * nb)
                .map(|i| (i * 2_654_435_761usize >> 7) as u8)
                .collect();
            for b in 0..nb {
                let blk = &mut w[b * bs..(b + 1) * bs];
                let one = f16::from_f32(0.0625).to_bits().to_le_bytes();
                match ty {
                    GgmlType::Q6_K => blk[208..210].copy_from_slice(&one),
                    GgmlType::Q4_K | GgmlType::Q5_K => {
                        blk[0..2].copy_from_slice(&one);
                        blk[2..4].copy_from_slice(&one);
                    }
                    _ => blk[0..2].copy_from_slice(&one),
                }
            }
            // x on the grid of a power-of-two scale: q * 2^-3 with |q| <= 127 and each block's
            // largest |q| = 127, so d = 127 * 2^-3 / 127 = 2^-3 exactly.
            let x: Vec<f32> = (0..cols)
                .map(|i| {
                    let q = if i % 32 == 0 {
                        127
                    } else {
                        ((i * 37) % 255) as i32 - 127
                    };
                    q as f32 * 0.125
                })
                .collect();
            let mut got = [0f32];
            mul_mat(ty, &w, 1, cols, &x, 1, &mut got);
            let mut deq = vec![0f32; cols];
            dequantize_row(ty, &w, &mut deq);
            let want: f64 = deq.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
            let scale: f64 = deq
                .iter()
                .zip(&x)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum();
            assert!(
                ((got[0] as f64) - want).abs() <= 1e-5 * scale,
                "{ty:?}: {} vs {want}",
                got[0]
            );
        }
    }
}
