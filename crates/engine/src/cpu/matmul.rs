//! Accurate-mode matrix products: weights dequantized exactly to f32, f32 products and sums.
//!
//! One canonical summation order for every dot product, whatever the number of tokens, so
//! the prompt path, the decode path and every micro-batch size give identical bits: the
//! products `w[i] * x[i]` are accumulated with fused multiply-adds into 8 lanes (lane
//! `i % 8`), in increasing `i`, and the lanes are summed as `((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7))`.
//! [`dot`] is the plain reference; the blocked kernel below computes the same bits.

use muser_gguf::GgmlType;
use rayon::prelude::*;

use crate::formats;

/// Rows dequantized at once by one task.
const ROW_BLOCK: usize = 16;
/// Tokens per inner tile (its activations stay in cache while a row block runs over them).
const TOKEN_TILE: usize = 64;

#[inline(always)]
fn reduce(a: [f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

#[inline(always)]
fn dot_generic(w: &[f32], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut acc = [0f32; 8];
    let (wc, wr) = w.as_chunks::<8>();
    let (xc, xr) = x.as_chunks::<8>();
    for (a, b) in wc.iter().zip(xc) {
        for l in 0..8 {
            acc[l] = a[l].mul_add(b[l], acc[l]);
        }
    }
    for (i, (a, b)) in wr.iter().zip(xr).enumerate() {
        acc[i] = a.mul_add(*b, acc[i]);
    }
    reduce(acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dot_avx2(w: &[f32], x: &[f32]) -> f32 {
    // The same code compiled with FMA available: `mul_add` becomes vfmadd (identical bits).
    dot_generic(w, x)
}

fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The canonical f32 dot product (reference for every accurate-mode product).
#[inline]
pub fn dot(w: &[f32], x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked at run time just above).
        return unsafe { dot_avx2(w, x) };
    }
    dot_generic(w, x)
}

/// A 4-row x 2-token tile of canonical dot products (same per-element order as [`dot`]).
#[inline(always)]
fn tile_4x2(w: [&[f32]; 4], x: [&[f32]; 2], out: &mut [[f32; 2]; 4]) {
    let n = x[0].len();
    let n8 = n / 8;
    let (w0, w1, w2, w3) = (
        w[0].as_chunks::<8>().0,
        w[1].as_chunks::<8>().0,
        w[2].as_chunks::<8>().0,
        w[3].as_chunks::<8>().0,
    );
    let (x0, x1) = (x[0].as_chunks::<8>().0, x[1].as_chunks::<8>().0);
    let mut acc = [[[0f32; 8]; 2]; 4];
    for i in 0..n8 {
        let (a, b) = ([&w0[i], &w1[i], &w2[i], &w3[i]], [&x0[i], &x1[i]]);
        for r in 0..4 {
            for t in 0..2 {
                for l in 0..8 {
                    acc[r][t][l] = a[r][l].mul_add(b[t][l], acc[r][t][l]);
                }
            }
        }
    }
    for r in 0..4 {
        for t in 0..2 {
            for (j, k) in (n8 * 8..n).enumerate() {
                acc[r][t][j] = w[r][k].mul_add(x[t][k], acc[r][t][j]);
            }
            out[r][t] = reduce(acc[r][t]);
        }
    }
}

/// [`block_generic`]'s products, the same bits: 4 rows by 3 tokens at a time in AVX2 registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn block_avx2(
    w: &[f32],
    cols: usize,
    nrows: usize,
    x: &[f32],
    ntok: usize,
    out: &mut [f32],
    ldo: usize,
) {
    // 4 rows by 3 tokens: 12 accumulators in flight (4 by 2 leaves the FMA latency exposed).
    block_tiles::<3, 12>(w, cols, nrows, x, ntok, out, ldo)
}

/// [`block_avx2`] where the CPU has AVX-512F and VL: the same 256-bit operations, the same
/// bits, with the 32 vector registers that EVEX encodings reach: 4 rows by 6 tokens, 24
/// accumulators, so a step loads 10 vectors for 24 FMAs instead of 7 for 12.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
fn block_avx512vl(
    w: &[f32],
    cols: usize,
    nrows: usize,
    x: &[f32],
    ntok: usize,
    out: &mut [f32],
    ldo: usize,
) {
    // Whole tiles of 6 tokens, then the rest as `block_avx2` takes them.
    let t6 = if cols % 8 == 0 { ntok / 6 * 6 } else { 0 };
    block_tiles::<6, 24>(w, cols, nrows, x, t6, out, ldo);
    let (xs, os) = (&x[t6 * cols..], &mut out[t6 * ldo..]);
    block_tiles::<3, 12>(w, cols, nrows, xs, ntok - t6, os, ldo)
}

/// 4 rows by `T` tokens (`A` = 4 T accumulators) at a time in 256-bit registers; the rest of
/// the tokens, and the last rows, as `block_generic` computes them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn block_tiles<const T: usize, const A: usize>(
    w: &[f32],
    cols: usize,
    nrows: usize,
    x: &[f32],
    ntok: usize,
    out: &mut [f32],
    ldo: usize,
) {
    use std::arch::x86_64::*;
    if ntok == 0 {
        return;
    }
    let row = |r: usize| w[r * cols..(r + 1) * cols].as_chunks::<8>().0;
    let tok = |t: usize| x[t * cols..(t + 1) * cols].as_chunks::<8>().0;
    let n8 = cols / 8;
    let tt = if cols % 8 == 0 { ntok / T * T } else { 0 };
    let mut r = 0;
    while r + 4 <= nrows {
        let ws = [row(r), row(r + 1), row(r + 2), row(r + 3)];
        for t in (0..tt).step_by(T) {
            let mut xs: [&[[f32; 8]]; T] = [&[]; T];
            for (k, xk) in xs.iter_mut().enumerate() {
                *xk = tok(t + k);
            }
            let mut acc = [_mm256_setzero_ps(); A];
            for i in 0..n8 {
                let mut xv = [_mm256_setzero_ps(); T];
                for (v, xk) in xv.iter_mut().zip(&xs) {
                    // SAFETY: each chunk holds 8 floats; loadu reads exactly 8.
                    *v = unsafe { _mm256_loadu_ps(xk[i].as_ptr()) };
                }
                for (rr, wr) in ws.iter().enumerate() {
                    // SAFETY: as above.
                    let wv = unsafe { _mm256_loadu_ps(wr[i].as_ptr()) };
                    for (k, xv) in xv.iter().enumerate() {
                        acc[T * rr + k] = _mm256_fmadd_ps(wv, *xv, acc[T * rr + k]);
                    }
                }
            }
            for (j, a) in acc.iter().enumerate() {
                let mut l = [0f32; 8];
                // SAFETY: `l` holds 8 floats.
                unsafe { _mm256_storeu_ps(l.as_mut_ptr(), *a) };
                out[(t + j % T) * ldo + r + j / T] = reduce(l);
            }
        }
        r += 4;
    }
    // The tokens from tt on for the rows done above, then every token of the last rows, as
    // `block_generic` computes them (its output row r' of a slice starting at `out[o]` is
    // `out[o + t * ldo + r']`).
    if tt < ntok && r > 0 {
        let (xs, os) = (&x[tt * cols..], &mut out[tt * ldo..]);
        block_generic(&w[..r * cols], cols, r, xs, ntok - tt, os, ldo);
    }
    if r < nrows {
        block_generic(&w[r * cols..], cols, nrows - r, x, ntok, &mut out[r..], ldo);
    }
}

/// out[t * ldo + r] = dot(w row r, x row t) for r < nrows, t < ntok.
#[inline(always)]
fn block_generic(
    w: &[f32],
    cols: usize,
    nrows: usize,
    x: &[f32],
    ntok: usize,
    out: &mut [f32],
    ldo: usize,
) {
    let row = |r: usize| &w[r * cols..(r + 1) * cols];
    let tok = |t: usize| &x[t * cols..(t + 1) * cols];
    let mut r = 0;
    while r + 4 <= nrows {
        let mut t = 0;
        while t + 2 <= ntok {
            let mut o = [[0f32; 2]; 4];
            tile_4x2(
                [row(r), row(r + 1), row(r + 2), row(r + 3)],
                [tok(t), tok(t + 1)],
                &mut o,
            );
            for (dr, orow) in o.iter().enumerate() {
                out[t * ldo + r + dr] = orow[0];
                out[(t + 1) * ldo + r + dr] = orow[1];
            }
            t += 2;
        }
        for t in t..ntok {
            for dr in 0..4 {
                out[t * ldo + r + dr] = dot_generic(row(r + dr), tok(t));
            }
        }
        r += 4;
    }
    for r in r..nrows {
        for t in 0..ntok {
            out[t * ldo + r] = dot_generic(row(r), tok(t));
        }
    }
}

/// Matrix-vector products for up to 4 tokens without materializing dequantized rows: each
/// 256-value group is dequantized into a stack buffer and accumulated at once, lane `i % 8`
/// in increasing `i` (the canonical order: the same bits as [`dot`]). Rows go `R` at a time so
/// their FMA chains (one per row, lane and token, each a strict sequence) interleave: a single
/// chain waits the FMA latency at every step.
#[inline(always)]
fn gemv_generic(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    nt: usize,
    y: &mut [f32],
) {
    const R: usize = 4;
    let row_bytes = w.len() / rows;
    let mut r = 0;
    while r + R <= rows {
        gemv_rows::<R>(ty, w, row_bytes, r, rows, cols, x, nt, y);
        r += R;
    }
    while r < rows {
        gemv_rows::<1>(ty, w, row_bytes, r, rows, cols, x, nt, y);
        r += 1;
    }
}

/// A hint that `b` will be read soon (no effect on results).
#[inline(always)]
fn prefetch(b: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it reads nothing architecturally and cannot fault; the
    // pointer comes from a live slice.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(b.as_ptr() as *const i8);
        if b.len() > 64 {
            _mm_prefetch::<_MM_HINT_T0>(b.as_ptr().add(64) as *const i8);
        }
        if b.len() > 128 {
            _mm_prefetch::<_MM_HINT_T0>(b.as_ptr().add(128) as *const i8);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = b;
}

/// The weights stream from memory: ask for byte `ahead` of rows r0..r0 + R (4 groups ahead of
/// the one being multiplied), or past the end of these rows the same place in the next R rows
/// (a row block's start was where the loads stalled).
#[inline(always)]
fn prefetch_rows<const R: usize>(w: &[u8], row_bytes: usize, r0: usize, ahead: usize) {
    for k in 0..R {
        let off = if ahead < row_bytes {
            (r0 + k) * row_bytes + ahead
        } else {
            (r0 + R + k) * row_bytes + (ahead - row_bytes)
        };
        if off < w.len() {
            prefetch(&w[off..]);
        }
    }
}

/// Rows r0..r0 + R of `gemv_generic`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gemv_rows<const R: usize>(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    r0: usize,
    rows: usize,
    cols: usize,
    x: &[f32],
    nt: usize,
    y: &mut [f32],
) {
    const G: usize = 256;
    let (bl, bs) = ty.block_geometry();
    let mut buf = [[0f32; G]; R];
    let mut acc = [[[0f32; 8]; 4]; R];
    let mut c0 = 0;
    while c0 < cols {
        let g = G.min(cols - c0);
        let nb = g / bl;
        prefetch_rows::<R>(w, row_bytes, r0, (c0 + 4 * G) / bl * bs);
        for (k, b) in buf.iter_mut().enumerate() {
            let row = &w[(r0 + k) * row_bytes..(r0 + k + 1) * row_bytes];
            let bytes = &row[c0 / bl * bs..(c0 / bl + nb) * bs];
            if bl == 1 {
                formats::dequantize_row(ty, bytes, &mut b[..g]);
            } else {
                for (o, blk) in b[..g].chunks_exact_mut(bl).zip(bytes.chunks_exact(bs)) {
                    formats::dequantize_block(ty, blk, o);
                }
            }
        }
        for t in 0..nt {
            let (xc, _) = x[t * cols + c0..t * cols + c0 + g].as_chunks::<8>();
            for (i, xv) in xc.iter().enumerate() {
                for k in 0..R {
                    let wv = &buf[k][8 * i..8 * i + 8];
                    let a = &mut acc[k][t];
                    for l in 0..8 {
                        a[l] = wv[l].mul_add(xv[l], a[l]);
                    }
                }
            }
        }
        // A tail shorter than 8 only occurs at the end of a row (widths are multiples of 8
        // for every format but F32/F16/BF16 with odd widths).
        let tail = g % 8;
        if tail != 0 {
            for k in 0..R {
                for t in 0..nt {
                    for j in 0..tail {
                        let i = g - tail + j;
                        acc[k][t][j] = buf[k][i].mul_add(x[t * cols + c0 + i], acc[k][t][j]);
                    }
                }
            }
        }
        c0 += g;
    }
    for k in 0..R {
        for t in 0..nt {
            y[t * rows + r0 + k] = reduce(acc[k][t]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn gemv_avx2(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    nt: usize,
    y: &mut [f32],
) {
    if ty == GgmlType::Q4_K && nt == 1 && cols % 256 == 0 {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above); AVX2, FMA and F16C are this
            // function's own target features.
            return unsafe { q4k_one_token_512(w, rows, cols, x, y) };
        }
        return q4k_one_token(w, rows, cols, x, y);
    }
    if ty == GgmlType::Q6_K && nt == 1 && cols % 256 == 0 {
        return q6k_one_token(w, rows, cols, x, y);
    }
    gemv_generic(ty, w, rows, cols, x, nt, y)
}

/// Q6_K, one token: `gemv_generic`'s arithmetic with the dequantization in registers, as
/// `q4k_one_token`: y = (d sc) q as `formats::dequant_q6_k` (exact in f32: d has 11
/// significant bits, sc at most 7 and q - 32 at most 5, so the products cannot round), then one
/// FMA per 8 weights into lane `i % 8`, in increasing `i`: the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn q6k_one_token(w: &[u8], rows: usize, cols: usize, x: &[f32], y: &mut [f32]) {
    const R: usize = 4;
    let row_bytes = w.len() / rows;
    let mut r = 0;
    while r + R <= rows {
        q6k_rows::<R>(w, row_bytes, r, cols, x, y);
        r += R;
    }
    while r < rows {
        q6k_rows::<1>(w, row_bytes, r, cols, x, y);
        r += 1;
    }
}

/// Rows r0..r0 + R of `q6k_one_token`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn q6k_rows<const R: usize>(
    w: &[u8],
    row_bytes: usize,
    r0: usize,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
) {
    use std::arch::x86_64::*;
    let nb = cols / 256;
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        prefetch_rows::<R>(w, row_bytes, r0, (b + 4) * 210);
        let mut blk: [&[u8]; R] = [&[]; R];
        for (k, bk) in blk.iter_mut().enumerate() {
            *bk = &w[(r0 + k) * row_bytes + b * 210..(r0 + k) * row_bytes + (b + 1) * 210];
        }
        // d sc of each 16 values (exact), in block order.
        let mut ds = [[0f32; 16]; R];
        for (dk, bk) in ds.iter_mut().zip(blk) {
            q6k_scales(bk, dk);
        }
        let xb = &x[b * 256..(b + 1) * 256];
        for n in 0..2 {
            q6k_quarter::<R, 0>(&blk, &ds, n, xb, &mut acc);
            q6k_quarter::<R, 1>(&blk, &ds, n, xb, &mut acc);
            q6k_quarter::<R, 2>(&blk, &ds, n, xb, &mut acc);
            q6k_quarter::<R, 3>(&blk, &ds, n, xb, &mut acc);
        }
    }
    for k in 0..R {
        let mut a = [0f32; 8];
        // SAFETY: `a` holds 8 floats.
        unsafe { _mm256_storeu_ps(a.as_mut_ptr(), acc[k]) };
        y[r0 + k] = reduce(a);
    }
}

/// A Q6_K block's d sc for each 16 values (exact: d has 11 significant bits, sc 8), in block
/// order.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn q6k_scales(blk: &[u8], ds: &mut [f32; 16]) {
    let d = formats::f16_at(blk, 208);
    for (o, &sc) in ds.iter_mut().zip(&blk[192..208]) {
        *o = d * (sc as i8) as f32;
    }
}

/// Quarter `Q` of half `n` of a Q6_K block: its 32 codes q - 32 as i8 (the low nibbles of
/// ql[64n..] (Q = 0, 2: shifted by 4 for Q = 2) or of ql[64n + 32..] (Q = 1, 3), and bits 2Q of
/// qh[32n..]), as `formats::dequant_q6_k`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn q6k_codes<const Q: usize>(blk: &[u8], n: usize) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let (m4, m3, c32) = (
        _mm256_set1_epi8(0x0F),
        _mm256_set1_epi8(0x03),
        _mm256_set1_epi8(32),
    );
    let src = 64 * n + 32 * (Q % 2);
    let (lo, hi) = (&blk[src..src + 32], &blk[128 + 32 * n..128 + 32 * n + 32]);
    // SAFETY: `lo` and `hi` hold 32 bytes each (checked slices); loadu reads exactly 32.
    let (l, h) = unsafe {
        (
            _mm256_loadu_si256(lo.as_ptr() as *const __m256i),
            _mm256_loadu_si256(hi.as_ptr() as *const __m256i),
        )
    };
    let l = if Q >= 2 { _mm256_srli_epi16::<4>(l) } else { l };
    let h = match Q {
        0 => h,
        1 => _mm256_srli_epi16::<2>(h),
        2 => _mm256_srli_epi16::<4>(h),
        _ => _mm256_srli_epi16::<6>(h),
    };
    let code = _mm256_or_si256(
        _mm256_and_si256(l, m4),
        _mm256_slli_epi16::<4>(_mm256_and_si256(h, m3)),
    );
    _mm256_sub_epi8(code, c32)
}

/// Quarter `Q` (32 values) of half `n` of the R rows' Q6_K blocks `blk` (`ds`: their d sc per
/// 16 values; the codes: `q6k_codes`) against `xb`, 8 values at a time into `acc`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn q6k_quarter<const R: usize, const Q: usize>(
    blk: &[&[u8]; R],
    ds: &[[f32; 16]; R],
    n: usize,
    xb: &[f32],
    acc: &mut [std::arch::x86_64::__m256; R],
) {
    use std::arch::x86_64::*;
    // The 32 codes of each row, q - 32 as i8 (a loop: `array::from_fn`'s closure would not
    // inline `q6k_codes`, whose target features it lacks).
    let mut codes = [_mm256_setzero_si256(); R];
    for (c, b) in codes.iter_mut().zip(blk) {
        *c = q6k_codes::<Q>(b, n);
    }
    for c in 0..4 {
        let xs = &xb[128 * n + 32 * Q + 8 * c..128 * n + 32 * Q + 8 * c + 8];
        // SAFETY: `xs` holds 8 floats (a checked slice); loadu reads exactly 8.
        let xv = unsafe { _mm256_loadu_ps(xs.as_ptr()) };
        for k in 0..R {
            // Codes 8c..8c + 8 of the 32.
            let half = if c < 2 {
                _mm256_castsi256_si128(codes[k])
            } else {
                _mm256_extracti128_si256::<1>(codes[k])
            };
            let eight = if c % 2 == 0 {
                half
            } else {
                _mm_srli_si128::<8>(half)
            };
            let qv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
            // The scale of these 8 values: sc[8n + c/2 + 2Q].
            let wv = _mm256_mul_ps(_mm256_set1_ps(ds[k][8 * n + c / 2 + 2 * Q]), qv);
            acc[k] = _mm256_fmadd_ps(wv, xv, acc[k]);
        }
    }
}

/// Block `b` of Q4_K rows r0..r0 + R: each row's sub-blocks' (d sc, dmin m), as
/// `formats::dequant_q4_k` makes them, and the row's 128 code bytes of the block.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::type_complexity)]
fn q4k_blocks<const R: usize>(
    w: &[u8],
    row_bytes: usize,
    r0: usize,
    b: usize,
) -> ([[(f32, f32); 8]; R], [&[u8]; R]) {
    let mut dm = [[(0f32, 0f32); 8]; R];
    let mut qs: [&[u8]; R] = [&[]; R];
    for (k, (dmk, qk)) in dm.iter_mut().zip(qs.iter_mut()).enumerate() {
        let row = r0 + k;
        let blk = &w[row * row_bytes + b * 144..row * row_bytes + (b + 1) * 144];
        let d = formats::f16_at(blk, 0);
        let dmin = formats::f16_at(blk, 2);
        for (s, e) in dmk.iter_mut().enumerate() {
            let (sc, m) = formats::scale_min_k4(s, &blk[4..16]);
            *e = (d * sc as f32, dmin * m as f32);
        }
        *qk = &blk[16..144];
    }
    (dm, qs)
}

/// Q4_K, one token: `gemv_generic`'s arithmetic with the dequantization in registers (no
/// buffer): y = (d sc) q - (dmin m) by a multiply then a subtraction, as `formats::dequant_q4_k`,
/// then one FMA per 8 weights into lane `i % 8`, in increasing `i`: the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4k_one_token(w: &[u8], rows: usize, cols: usize, x: &[f32], y: &mut [f32]) {
    const R: usize = 4;
    let row_bytes = w.len() / rows;
    let mut r = 0;
    while r + R <= rows {
        q4k_rows::<R>(w, row_bytes, r, rows, cols, x, y);
        r += R;
    }
    while r < rows {
        q4k_rows::<1>(w, row_bytes, r, rows, cols, x, y);
        r += 1;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4k_rows<const R: usize>(
    w: &[u8],
    row_bytes: usize,
    r0: usize,
    rows: usize,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
) {
    use std::arch::x86_64::*;
    let nb = cols / 256;
    let mut acc = [_mm256_setzero_ps(); R];
    let mask = _mm_set1_epi8(0x0F);
    for b in 0..nb {
        prefetch_rows::<R>(w, row_bytes, r0, (b + 4) * 144);
        let (dm, qs) = q4k_blocks::<R>(w, row_bytes, r0, b);
        let xb = &x[b * 256..(b + 1) * 256];
        for s in 0..8 {
            let (j, shift) = (s / 2, 4 * (s % 2) as i32);
            for c in 0..4 {
                let xs = &xb[32 * s + 8 * c..32 * s + 8 * c + 8];
                // SAFETY: `xs` holds 8 floats (a checked slice); loadu reads exactly 8.
                let xv = unsafe { _mm256_loadu_ps(xs.as_ptr()) };
                for k in 0..R {
                    let src = &qs[k][32 * j + 8 * c..32 * j + 8 * c + 8];
                    // SAFETY: `src` holds 8 bytes (a checked slice); loadl reads exactly 8.
                    let v = unsafe { _mm_loadl_epi64(src.as_ptr() as *const __m128i) };
                    let v = if shift == 4 {
                        _mm_srli_epi16::<4>(v)
                    } else {
                        v
                    };
                    let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(v, mask)));
                    let (dd, mm) = dm[k][s];
                    // (d sc) q - dmin m rounded once, as the multiply then the subtraction
                    // round it: d sc is an f16 times a 6-bit scale (17 significant bits at
                    // most) and q has 4 bits, so the product is exact in f32 and only the
                    // subtraction rounds, in `fmsub` as in `sub`.
                    let wv = _mm256_fmsub_ps(_mm256_set1_ps(dd), q, _mm256_set1_ps(mm));
                    acc[k] = _mm256_fmadd_ps(wv, xv, acc[k]);
                }
            }
        }
    }
    for k in 0..R {
        let mut a = [0f32; 8];
        // SAFETY: `a` holds 8 floats.
        unsafe { _mm256_storeu_ps(a.as_mut_ptr(), acc[k]) };
        y[r0 + k] = reduce(a);
    }
    let _ = rows;
}

/// Q4_K, one token, where the CPU has AVX-512F: `q4k_one_token`'s bits with two rows in each
/// 512-bit vector (row 2p in the low 8 lanes, row 2p + 1 in the high 8). A sub-block's 16
/// possible weights, (d sc) q - dmin m for q = 0..15, are made once per row by the same `fmsub`
/// that `q4k_rows` applies to each weight (the same bits), and each weight is looked up from its
/// code: one `vpermt2ps` serves 16 weights of the two rows, where `q4k_rows` converts and scales
/// 8. Each row's lanes then take the same FMAs in the same order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn q4k_one_token_512(w: &[u8], rows: usize, cols: usize, x: &[f32], y: &mut [f32]) {
    let row_bytes = w.len() / rows;
    let mut r = 0;
    while r + 2 * PAIRS_512 <= rows {
        q4k_pairs_512(w, row_bytes, r, cols, x, y);
        r += 2 * PAIRS_512;
    }
    while r < rows {
        q4k_rows::<1>(w, row_bytes, r, rows, cols, x, y);
        r += 1;
    }
}

/// Row pairs a `q4k_pairs_512` call multiplies.
#[cfg(target_arch = "x86_64")]
const PAIRS_512: usize = 2;

/// Rows r0..r0 + 2 PAIRS_512 of `q4k_one_token_512`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn q4k_pairs_512(w: &[u8], row_bytes: usize, r0: usize, cols: usize, x: &[f32], y: &mut [f32]) {
    use std::arch::x86_64::*;
    const P: usize = PAIRS_512;
    const R: usize = 2 * PAIRS_512;
    let nb = cols / 256;
    let mut acc = [_mm512_setzero_ps(); P];
    let mask = _mm_set1_epi8(0x0F);
    // The high row's codes index the second table (vpermt2ps's bit 4).
    let high = _mm_set_epi64x(0x1010_1010_1010_1010, 0);
    let iota = _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    );
    let code8 = |src: &[u8]| {
        u64::from_le_bytes([
            src[0], src[1], src[2], src[3], src[4], src[5], src[6], src[7],
        ]) as i64
    };
    for b in 0..nb {
        prefetch_rows::<R>(w, row_bytes, r0, (b + 4) * 144);
        let (dm, qs) = q4k_blocks::<R>(w, row_bytes, r0, b);
        let xb = &x[b * 256..(b + 1) * 256];
        for s in 0..8 {
            let (j, odd) = (s / 2, s % 2 == 1);
            // Each row's 16 possible weights: `q4k_rows`'s fmsub on q = 0..15.
            let table = |k: usize| {
                let (dd, mm) = dm[k][s];
                _mm512_fmsub_ps(_mm512_set1_ps(dd), iota, _mm512_set1_ps(mm))
            };
            let mut tables = [(_mm512_setzero_ps(), _mm512_setzero_ps()); P];
            for (p, t) in tables.iter_mut().enumerate() {
                *t = (table(2 * p), table(2 * p + 1));
            }
            for c in 0..4 {
                let xs = &xb[32 * s + 8 * c..32 * s + 8 * c + 8];
                // SAFETY: `xs` holds 8 floats (a checked slice); loadu reads exactly 8.
                let x8 = unsafe { _mm256_loadu_ps(xs.as_ptr()) };
                let xv = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                    _mm512_castpd256_pd512(_mm256_castps_pd(x8)),
                    _mm256_castps_pd(x8),
                ));
                for (p, (ta, tb)) in tables.iter().enumerate() {
                    let at = 32 * j + 8 * c;
                    let v = _mm_set_epi64x(
                        code8(&qs[2 * p + 1][at..at + 8]),
                        code8(&qs[2 * p][at..at + 8]),
                    );
                    let v = if odd { _mm_srli_epi16::<4>(v) } else { v };
                    let idx = _mm512_cvtepu8_epi32(_mm_or_si128(_mm_and_si128(v, mask), high));
                    let wv = _mm512_permutex2var_ps(*ta, idx, *tb);
                    acc[p] = _mm512_fmadd_ps(wv, xv, acc[p]);
                }
            }
        }
    }
    for (p, a) in acc.iter().enumerate() {
        let mut l = [[0f32; 8]; 2];
        // SAFETY: `l` is 16 contiguous floats; storeu writes exactly 16.
        unsafe { _mm512_storeu_ps(l.as_mut_ptr() as *mut f32, *a) };
        y[r0 + 2 * p] = reduce(l[0]);
        y[r0 + 2 * p + 1] = reduce(l[1]);
    }
}

/// y[t][r] = W[r] . x[t] for a weight matrix of `rows` x `cols` in format `ty` and `n_tokens`
/// activation rows; `y` is `n_tokens` x `rows`.
pub fn matmul(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) {
    debug_assert_eq!(x.len(), n_tokens * cols);
    debug_assert_eq!(y.len(), n_tokens * rows);
    let row_bytes = w.len() / rows;
    let avx = has_avx2_fma();
    #[cfg(target_arch = "x86_64")]
    let avx512vl = avx
        && std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512vl");
    if n_tokens <= 4 && cols % 8 == 0 {
        // Decode: rows in parallel, tokens-major output gathered per chunk of rows.
        const CHUNK: usize = 64;
        let parts: Vec<(usize, Vec<f32>)> = (0..rows.div_ceil(CHUNK))
            .into_par_iter()
            .map(|c| {
                let r0 = c * CHUNK;
                let nr = CHUNK.min(rows - r0);
                let ws = &w[r0 * row_bytes..(r0 + nr) * row_bytes];
                let mut out = vec![0f32; n_tokens * nr];
                #[cfg(target_arch = "x86_64")]
                if avx && std::is_x86_feature_detected!("f16c") {
                    // SAFETY: AVX2, FMA and F16C are present (checked at run time just above).
                    unsafe { gemv_avx2(ty, ws, nr, cols, x, n_tokens, &mut out) };
                    return (r0, out);
                }
                gemv_generic(ty, ws, nr, cols, x, n_tokens, &mut out);
                (r0, out)
            })
            .collect();
        for (r0, out) in parts {
            let nr = out.len() / n_tokens;
            for t in 0..n_tokens {
                y[t * rows + r0..t * rows + r0 + nr].copy_from_slice(&out[t * nr..(t + 1) * nr]);
            }
        }
        return;
    }
    // Each task owns a block of output columns (weight rows) for all tokens. Output rows are
    // strided, so tasks write into private buffers and the results are scattered after.
    let blocks: Vec<(usize, Vec<f32>)> = (0..rows.div_ceil(ROW_BLOCK))
        .into_par_iter()
        .map_init(Vec::new, |wf: &mut Vec<f32>, b| {
            // The dequantized rows live in a buffer each worker reuses (no page faults per task).
            let r0 = b * ROW_BLOCK;
            let nr = ROW_BLOCK.min(rows - r0);
            wf.resize(nr * cols, 0.0);
            for r in 0..nr {
                let src = &w[(r0 + r) * row_bytes..(r0 + r + 1) * row_bytes];
                formats::dequantize_row(ty, src, &mut wf[r * cols..(r + 1) * cols]);
            }
            let mut out = vec![0f32; n_tokens * nr];
            let mut t0 = 0;
            while t0 < n_tokens {
                let nt = TOKEN_TILE.min(n_tokens - t0);
                let xs = &x[t0 * cols..(t0 + nt) * cols];
                let os = &mut out[t0 * nr..(t0 + nt) * nr];
                #[cfg(target_arch = "x86_64")]
                if avx {
                    if avx512vl {
                        // SAFETY: AVX2, FMA, AVX-512F and AVX-512VL are present (checked at
                        // run time: has_avx2_fma and `avx512vl`).
                        unsafe { block_avx512vl(&wf[..nr * cols], cols, nr, xs, nt, os, nr) };
                    } else {
                        // SAFETY: AVX2 and FMA are present (runtime check in has_avx2_fma).
                        unsafe { block_avx2(&wf[..nr * cols], cols, nr, xs, nt, os, nr) };
                    }
                    t0 += nt;
                    continue;
                }
                let _ = avx;
                block_generic(&wf[..nr * cols], cols, nr, xs, nt, os, nr);
                t0 += nt;
            }
            (r0, out)
        })
        .collect();
    for (r0, out) in blocks {
        let nr = out.len() / n_tokens.max(1);
        for t in 0..n_tokens {
            y[t * rows + r0..t * rows + r0 + nr].copy_from_slice(&out[t * nr..(t + 1) * nr]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    #[test]
    fn every_token_count_gives_the_same_bits_as_the_reference_dot() {
        let mut s = 7u64;
        // (21, 1100): rows past the tiles of 4, a tail shorter than 8 and long rows.
        for &(rows, cols) in &[(37usize, 64usize), (16, 100), (5, 8), (40, 256), (21, 1100)] {
            let w: Vec<f32> = (0..rows * cols).map(|_| lcg(&mut s)).collect();
            let wb: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
            for n in [1usize, 2, 3, 7, 11, 70] {
                let x: Vec<f32> = (0..n * cols).map(|_| lcg(&mut s)).collect();
                let mut y = vec![0f32; n * rows];
                matmul(GgmlType::F32, &wb, rows, cols, &x, n, &mut y);
                for t in 0..n {
                    for r in 0..rows {
                        let want = dot(&w[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                        assert_eq!(
                            y[t * rows + r].to_bits(),
                            want.to_bits(),
                            "rows {rows} cols {cols} n {n} t {t} r {r}"
                        );
                        let f64sum: f64 = (0..cols)
                            .map(|i| w[r * cols + i] as f64 * x[t * cols + i] as f64)
                            .sum();
                        assert!((want as f64 - f64sum).abs() < 1e-5, "{want} vs {f64sum}");
                    }
                }
            }
        }
    }

    /// The prompt tiles, 4 rows by 3 tokens (AVX2) and by 6 (AVX-512VL's 32 registers), called
    /// directly: each output the bits of `block_generic`'s, for row counts past and short of
    /// the tiles, token counts past and short of them, and widths with and without a tail.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn prompt_tiles_give_the_generic_bits() {
        if !has_avx2_fma() {
            println!("SKIPPED: the CPU lacks AVX2 or FMA");
            return;
        }
        let vl =
            std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vl");
        if !vl {
            println!("the 6-token tiles not run: the CPU lacks AVX-512F or VL");
        }
        let mut s = 5u64;
        for (nrows, cols) in [(16usize, 256usize), (7, 64), (4, 100), (9, 8)] {
            let w: Vec<f32> = (0..nrows * cols).map(|_| lcg(&mut s)).collect();
            for ntok in [1usize, 2, 3, 5, 6, 7, 12, 13, 64] {
                let x: Vec<f32> = (0..ntok * cols).map(|_| lcg(&mut s)).collect();
                let mut want = vec![0f32; ntok * nrows];
                block_generic(&w, cols, nrows, &x, ntok, &mut want, nrows);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                let mut got = vec![0f32; ntok * nrows];
                // SAFETY: AVX2 and FMA are present (checked above).
                unsafe { block_avx2(&w, cols, nrows, &x, ntok, &mut got, nrows) };
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "AVX2, {nrows}x{cols}, {ntok} tokens"
                );
                if vl {
                    let mut got = vec![0f32; ntok * nrows];
                    // SAFETY: AVX2, FMA, AVX-512F and VL are present (checked above).
                    unsafe { block_avx512vl(&w, cols, nrows, &x, ntok, &mut got, nrows) };
                    assert_eq!(bits(&got), bits(&want), "AVX-512VL, {nrows}x{cols}, {ntok}");
                }
            }
        }
    }

    /// Q4_K's one-token kernels, the AVX2 form and (where the CPU has AVX-512F) the form with
    /// two rows a vector, called directly: 1 to 9 rows (pairs of pairs and every tail), two
    /// blocks a row, each row's bits those of the canonical dot of its exactly dequantized row.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn q4k_one_token_forms_give_the_reference_bits() {
        if !(has_avx2_fma() && std::is_x86_feature_detected!("f16c")) {
            println!("SKIPPED: the CPU lacks AVX2, FMA or F16C");
            return;
        }
        let avx512 = std::is_x86_feature_detected!("avx512f");
        if !avx512 {
            println!("the two-rows-a-vector form not run: the CPU lacks AVX-512F");
        }
        let mut s = 23u64;
        let cols = 512;
        for rows in 1..=9usize {
            let mut wb: Vec<u8> = (0..rows * cols / 256 * 144)
                .map(|_| ((lcg(&mut s) + 0.5) * 255.0) as u8)
                .collect();
            for blk in wb.chunks_exact_mut(144) {
                for f in [0, 2] {
                    let d = half::f16::from_f32(0.01 + 0.02 * (lcg(&mut s) + 0.5));
                    blk[f..f + 2].copy_from_slice(&d.to_bits().to_le_bytes());
                }
            }
            let x: Vec<f32> = (0..cols).map(|_| lcg(&mut s)).collect();
            let mut want = vec![0f32; rows];
            for (r, w) in want.iter_mut().enumerate() {
                let mut wr = vec![0f32; cols];
                formats::dequantize_row(GgmlType::Q4_K, &wb[r * 288..(r + 1) * 288], &mut wr);
                *w = dot(&wr, &x);
            }
            let mut y = vec![0f32; rows];
            // SAFETY: AVX2, FMA and F16C are present (checked above).
            unsafe { q4k_one_token(&wb, rows, cols, &x, &mut y) };
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&y), bits(&want), "AVX2 form, {rows} rows");
            if avx512 {
                let mut y = vec![0f32; rows];
                // SAFETY: AVX-512F, AVX2, FMA and F16C are present (checked above).
                unsafe { q4k_one_token_512(&wb, rows, cols, &x, &mut y) };
                assert_eq!(bits(&y), bits(&want), "AVX-512 form, {rows} rows");
            }
        }
    }

    #[test]
    fn quantized_one_token_products_give_the_reference_bits() {
        // Every format's one-token path (Q4_K's in-register dequantization included) against
        // the canonical dot of the exactly dequantized rows; 7 rows: a block of 4 and a tail.
        let mut s = 11u64;
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::Q8_0,
            GgmlType::F16,
        ] {
            let (rows, cols) = (7usize, 512usize);
            let (bl, bs) = ty.block_geometry();
            let mut wb: Vec<u8> = (0..rows * cols / bl * bs)
                .map(|_| ((lcg(&mut s) + 0.5) * 255.0) as u8)
                .collect();
            // Sane f16 scales (d, dmin, ...): overwrite every 2-byte field a block starts with.
            for blk in wb.chunks_exact_mut(bs) {
                let d = half::f16::from_f32(0.01 + 0.02 * (lcg(&mut s) + 0.5))
                    .to_bits()
                    .to_le_bytes();
                match ty {
                    GgmlType::Q4_K => {
                        blk[0..2].copy_from_slice(&d);
                        blk[2..4].copy_from_slice(&d);
                    }
                    GgmlType::Q6_K => blk[208..210].copy_from_slice(&d),
                    GgmlType::Q8_0 => blk[0..2].copy_from_slice(&d),
                    _ => {
                        for v in blk.chunks_exact_mut(2) {
                            v.copy_from_slice(
                                &half::f16::from_f32(lcg(&mut s)).to_bits().to_le_bytes(),
                            );
                        }
                    }
                }
            }
            let x: Vec<f32> = (0..cols).map(|_| lcg(&mut s)).collect();
            let mut y = vec![0f32; rows];
            matmul(ty, &wb, rows, cols, &x, 1, &mut y);
            let row_bytes = wb.len() / rows;
            for r in 0..rows {
                let mut wr = vec![0f32; cols];
                formats::dequantize_row(ty, &wb[r * row_bytes..(r + 1) * row_bytes], &mut wr);
                assert_eq!(y[r].to_bits(), dot(&wr, &x).to_bits(), "{ty} row {r}");
                assert!(y[r].is_finite());
            }
        }
    }
}
