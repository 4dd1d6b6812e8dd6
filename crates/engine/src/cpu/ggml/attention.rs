//! Non-flash attention over the KV cache, as llama.cpp b11434 builds it
//! (llama-graph.cpp:2691 `build_attn_mha`, flash attention off) and ggml-cpu computes it:
//! ```text
//! kq  = mul_mat(K_view, q)                  [n_kv, n_tokens, n_head]; K head = q head / (n_head/n_head_kv)
//! kq  = soft_max_ext(kq, kq_mask, scale)    f32 mask: 0 visible, -inf otherwise
//! kqv = mul_mat(V_view_transposed, kq)      [head_dim, n_tokens, n_head]
//! out = cont(permute(kqv))                  [n_tokens][n_head * head_dim]
//! ```
//! The K view spans the first `n_kv` cache cells (slots), whatever they hold; the mask hides empty
//! cells, other sequences, future positions and positions outside the sliding window. A hidden
//! cell adds exact zeros everywhere (its score is -inf, its weight 0), so only the visible keys
//! are passed in, each with its slot: the slot decides which SIMD lane and which 8-group a key
//! lands in, so it is part of the arithmetic, and so is `n_kv`.
//!
//! The two matmuls route like any `GGML_OP_MUL_MAT` (see [`super::mul_mat`]): q is a permuted,
//! non-contiguous view, and the softmax output is contiguous, which gives
//!
//! | cache type | `Q·K` (n_tokens = 1 / >= 2)              | `V·P` (n_tokens = 1 / >= 2)               |
//! |------------|------------------------------------------|-------------------------------------------|
//! | f32        | vec_dot_f32 / vec_dot_f32                | vec_dot_f32 / tinyBLAS f32                |
//! | f16        | q->f16, vec_dot_f16 / tinyBLAS f16       | P->f16, vec_dot_f16 / tinyBLAS f16        |
//! | bf16       | q->bf16, vec_dot_bf16 / tinyBLAS bf16    | P->bf16, vec_dot_bf16 / tinyBLAS bf16     |
//! | q8_0 (K)   | q->q8_0, vec_dot_q8_0 / tinyBLAS_Q0      | (V: flash attention only)                 |
//!
//! (K and V types are independent. tinyBLAS_Q0 gives the same bits as vec_dot_q8_0. With a q8_0 K
//! cache, llama.cpp first rotates Q and K: see [`super::hadamard`].)
//! (tinyBLAS needs `rows % 4 == 0`: `n_kv` for `Q·K`, `head_dim` for `V·P`; otherwise vec_dot.)

use muser_gguf::GgmlType;
use rayon::prelude::*;

use super::kv::kv_row_bytes;
use super::lanes::{
    bf16_to_f32, f16_lut, f16_to_f32, f32_to_bf16, f32_to_f16, fma, hsum8, reduce4x8, v_expf,
    with_avx2_fma,
};
use super::quantize::{Q8_0_BYTES, QK8_0, quantize_row_q8_0};
use super::vec_dot::{vec_dot_f32, vec_dot_q0_q8_0};

// The micro-batch form of the tinyBLAS paths (x86's AVX2 registers).
#[cfg(target_arch = "x86_64")]
mod tiles;

/// One key of the cache: its cell index (slot) in the layer's cache, its position, and its K and V
/// rows (`n_head_kv * head_dim` values each, in the cache types' bytes, as [`super::store_kv_row`]
/// writes them).
#[derive(Clone, Copy, Debug)]
pub struct KvKey<'a> {
    pub slot: usize,
    pub pos: i32,
    pub k: &'a [u8],
    pub v: &'a [u8],
}

/// Shape and cache parameters of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnParams {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// The K cache type: F32, F16, BF16, or Q8_0 (then Q and K must have been rotated with
    /// [`super::hadamard_rotate`], as llama.cpp does for a quantized K cache).
    pub k_type: GgmlType,
    /// The V cache type: F32, F16 or BF16 (a quantized V cache needs flash attention).
    pub v_type: GgmlType,
    /// The graph's `n_kv` for this cache (see [`super::KvLayout`]).
    pub n_kv: usize,
    /// `Some(n_swa)` on sliding layers: key visible iff `0 <= q_pos - pos < n_swa`.
    pub n_swa: Option<u32>,
    /// `kq_scale`, `1.0f / sqrtf(head_dim)` for muse-glimmer.
    pub scale: f32,
}

/// The KQ mask of llama-kv-cache.cpp `set_input_kq_mask` for one sequence: causal, plus the
/// standard sliding window (`is_masked_swa`: hidden iff `q_pos - pos >= n_swa`).
#[inline]
pub fn visible(pos: i32, q_pos: i32, n_swa: Option<u32>) -> bool {
    pos <= q_pos && n_swa.is_none_or(|w| (q_pos as i64 - pos as i64) < w as i64)
}

/// Non-flash attention for one layer and one ubatch of `q_pos.len()` tokens.
/// `q` is `[n_tokens][n_head][head_dim]` (after QK-norm and RoPE), `out` is
/// `[n_tokens][n_head * head_dim]`. `keys` are the non-empty cells of this sequence in the layer's
/// cache (any order; hidden ones are masked here), every slot `< n_kv`.
pub fn attention(p: &AttnParams, q: &[f32], q_pos: &[i32], keys: &[KvKey], out: &mut [f32]) {
    attention_in(p, q, q_pos, keys, out, true)
}

/// [`attention`] (token, head) by (token, head) where [`attention`] would take the micro-batch
/// tiles: the same bits, for the tests that show it and for benches.
#[doc(hidden)]
pub fn attention_by_head(
    p: &AttnParams,
    q: &[f32],
    q_pos: &[i32],
    keys: &[KvKey],
    out: &mut [f32],
) {
    attention_in(p, q, q_pos, keys, out, false)
}

fn attention_in(
    p: &AttnParams,
    q: &[f32],
    q_pos: &[i32],
    keys: &[KvKey],
    out: &mut [f32],
    tiled: bool,
) {
    let n_tokens = q_pos.len();
    let (nh, nkv, hd) = (p.n_head, p.n_head_kv, p.head_dim);
    assert!(
        nh % nkv == 0,
        "attention: n_head {nh} not a multiple of n_head_kv {nkv}"
    );
    assert_eq!(q.len(), n_tokens * nh * hd, "attention: q length");
    assert_eq!(out.len(), n_tokens * nh * hd, "attention: out length");
    match p.k_type {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {}
        GgmlType::Q8_0 => assert!(
            hd % 32 == 0,
            "attention: a Q8_0 K cache needs head_dim % 32 == 0"
        ),
        t => panic!(
            "ggml parity attention: K cache type {t} is not supported (f32, f16, bf16, q8_0)"
        ),
    }
    match p.v_type {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {}
        t => panic!(
            "ggml parity attention: V cache type {t} is not supported without flash attention"
        ),
    }
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by_key(|&i| keys[i].slot);
    for w in order.windows(2) {
        assert!(
            keys[w[0]].slot != keys[w[1]].slot,
            "attention: two keys in slot {}",
            keys[w[0]].slot
        );
    }
    for k in keys {
        assert!(
            k.slot < p.n_kv,
            "attention: slot {} outside n_kv {}",
            k.slot,
            p.n_kv
        );
        assert!(
            k.k.len() == kv_row_bytes(p.k_type, nkv * hd)
                && k.v.len() == kv_row_bytes(p.v_type, nkv * hd),
            "attention: K/V row size"
        );
    }
    let sorted: Vec<KvKey> = order.iter().map(|&i| keys[i]).collect();
    #[cfg(target_arch = "x86_64")]
    if tiled && tiles::one_token_applies(p, n_tokens) {
        tiles::one_token(p, q, q_pos[0], &sorted, out);
        return;
    }

    // K and V of the keys, widened to f32 (exact for f16/bf16), per KV head: [kvh][key][d];
    // a Q8_0 K stays in blocks
    let nk = sorted.len();
    let q8k = p.k_type == GgmlType::Q8_0;
    // One token over an f16 cache reads the rows where they lie, widened in registers as the
    // dots read them (as ggml's vec_dot_f16 converts them), where the CPU has the instructions:
    // planes widened first would be written and read again for the one token (8 MB a layer at
    // 4,096 keys), more than the caches hold. More tokens share one widening.
    let k16 = n_tokens == 1 && p.k_type == GgmlType::F16 && super::lanes::has_avx2_fma();
    let v16 = n_tokens == 1 && p.v_type == GgmlType::F16 && lane_sums_f16_ok(hd);
    // The micro-batch tiles lay V out by slot groups straight from the rows.
    #[cfg(target_arch = "x86_64")]
    let tiles = tiled && tiles::applies(p, n_tokens);
    #[cfg(not(target_arch = "x86_64"))]
    let tiles = false;
    let (mut kf, mut vf) = PLANES.with(|w| w.take());
    if q8k || k16 {
        kf.clear();
    } else {
        widen(p.k_type, &sorted, hd, true, nkv * nk * hd, &mut kf);
    }
    if v16 || tiles {
        vf.clear();
    } else {
        widen(p.v_type, &sorted, hd, false, nkv * nk * hd, &mut vf);
    }
    let kq8: Vec<&[u8]> = if q8k || k16 {
        sorted.iter().map(|k| k.k).collect()
    } else {
        Vec::new()
    };
    let vrows: Vec<&[u8]> = if v16 {
        sorted.iter().map(|k| k.v).collect()
    } else {
        Vec::new()
    };
    let slots: Vec<usize> = sorted.iter().map(|k| k.slot).collect();
    let kpos: Vec<i32> = sorted.iter().map(|k| k.pos).collect();
    #[cfg(target_arch = "x86_64")]
    if tiles {
        tiles::attention(p, q, q_pos, &sorted, &kf, out);
        PLANES.with(|w| w.replace((kf, vf)));
        return;
    }

    out.par_chunks_mut(hd).enumerate().for_each(|(th, o)| {
        let (t, h) = (th / nh, th % nh);
        let kvh = h / (nh / nkv);
        let qrow = &q[th * hd..(th + 1) * hd];
        let plane = kvh * nk * hd..(kvh + 1) * nk * hd;
        let kp = if q8k {
            KPlane::Q8_0 { rows: &kq8, kvh }
        } else if k16 {
            KPlane::F16 { rows: &kq8, kvh }
        } else {
            KPlane::F32(&kf[plane.clone()])
        };
        let vp = if v16 {
            VPlane::F16 { rows: &vrows, kvh }
        } else {
            VPlane::F32(&vf[plane])
        };
        with_avx2_fma(
            #[inline(always)]
            || head(p, n_tokens, qrow, q_pos[t], &slots, &kpos, &kp, &vp, o),
        );
    });
    PLANES.with(|w| w.replace((kf, vf)));
}

thread_local! {
    /// The widened K and V planes of this thread's last [`attention`] call, whose memory the
    /// next call writes over: one decode step at 4,096 keys widens 8 MB a layer, and fresh
    /// buffers of that size came as zeroed pages from the kernel on every call.
    static PLANES: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Widen the K (`is_k`) or V rows of `keys` to f32 into `out` as `[kvh][key][d]`, `n` values
/// (`n_head_kv` x keys x `hd`); what `out` held before is dropped.
fn widen(ty: GgmlType, keys: &[KvKey], hd: usize, is_k: bool, n: usize, out: &mut Vec<f32>) {
    assert!(
        hd > 0 && n.is_multiple_of(hd),
        "widen: {n} values in rows of {hd}"
    );
    let nk = keys.len();
    out.clear();
    out.reserve(n);
    out.spare_capacity_mut()[..n]
        .par_chunks_mut(hd)
        .enumerate()
        .for_each(|(i, o)| {
            let (kvh, j) = (i / nk, i % nk);
            let row = if is_k { keys[j].k } else { keys[j].v };
            widen_row(ty, row, kvh, o);
        });
    // SAFETY: the n values were written above: each chunk of hd (the last one too: n is a
    // multiple of hd) took one value per element (`widen_row` writes every value of its
    // output in every branch).
    unsafe { out.set_len(n) };
}

/// KV head `kvh`'s part of a cache row of type `ty` (f32, f16 or bf16 bytes), `o.len()` values,
/// widened to f32 (exact) into `o`, every value written.
fn widen_row(ty: GgmlType, row: &[u8], kvh: usize, o: &mut [std::mem::MaybeUninit<f32>]) {
    let hd = o.len();
    match ty {
        GgmlType::F32 => {
            for (d, c) in o
                .iter_mut()
                .zip(row[kvh * hd * 4..(kvh + 1) * hd * 4].chunks_exact(4))
            {
                d.write(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
        }
        GgmlType::F16 => {
            let src = &row[kvh * hd * 2..(kvh + 1) * hd * 2];
            if super::lanes::has_avx2_fma() {
                // SAFETY: the CPU has F16C and AVX (`has_avx2_fma` checked avx2, fma and f16c);
                // the function reads and writes through checked slices.
                unsafe { widen_f16c(src, o) };
            } else {
                let lut = f16_lut();
                for (d, c) in o.iter_mut().zip(src.chunks_exact(2)) {
                    d.write(lut[u16::from_le_bytes([c[0], c[1]]) as usize]);
                }
            }
        }
        _ => {
            for (d, c) in o
                .iter_mut()
                .zip(row[kvh * hd * 2..(kvh + 1) * hd * 2].chunks_exact(2))
            {
                d.write(bf16_to_f32(u16::from_le_bytes([c[0], c[1]])));
            }
        }
    }
}

/// f16 values (`src`, little-endian, at least twice `out`'s length in bytes) to f32 by the CPU's
/// conversion ([`crate::formats::f16c_to`]): exact, the values of [`f16_lut`].
///
/// # Safety
/// The CPU must have avx and f16c.
unsafe fn widen_f16c(src: &[u8], out: &mut [std::mem::MaybeUninit<f32>]) {
    // SAFETY: `out` is valid for out.len() writes of f32 (MaybeUninit<f32> has f32's layout); the
    // caller vouches for the CPU's avx and f16c.
    unsafe { crate::formats::f16c_to(src, out.as_mut_ptr() as *mut f32, out.len()) }
}

/// Round to the cache type and back (q and P are converted to the K / V `vec_dot_type`).
#[inline(always)]
fn round_to(ty: GgmlType, v: f32) -> f32 {
    match ty {
        GgmlType::F32 => v,
        GgmlType::F16 => f16_to_f32(f32_to_f16(v)),
        _ => bf16_to_f32(f32_to_bf16(v)),
    }
}

/// Dot of two f32 rows of `head_dim` with the lane structure of the kernel ggml uses for this
/// cache type and path (`sgemm`: tinyBLAS, else vec_dot); inputs are exact widenings.
#[inline(always)]
fn dot_kq(ty: GgmlType, sgemm: bool, k: &[f32], q: &[f32]) -> f32 {
    if sgemm {
        return dot_sgemm([k], q)[0];
    }
    let n = k.len();
    if ty == GgmlType::F32 {
        return vec_dot_f32(k, q);
    }
    let np = n & !31;
    let a = sums4x8(&k[..np], &q[..np]);
    let mut sumf = if ty == GgmlType::F16 {
        reduce4x8(&a) as f64
    } else {
        let mut v = [0.0f32; 8];
        for l in 0..8 {
            v[l] = (a[0][l] + a[2][l]) + (a[1][l] + a[3][l]);
        }
        hsum8(&v) as f64
    };
    for i in np..n {
        sumf += (k[i] * q[i]) as f64;
    }
    sumf as f32
}

/// `acc[j][l] = fma(k[32 i + 8 j + l], q[32 i + 8 j + l], acc[j][l])` over the 32s i of `k` and
/// `q` (equal lengths, a multiple of 32), in order: ggml's vec_dot loops' 4 x 8 accumulators.
/// In AVX2 registers where the CPU has AVX2 and FMA (the same FMAs in the same order, so the
/// same bits; the plain loop, compiled inside the AVX2 copy of the attention, came out as
/// 128-bit pieces and shuffles and was most of a decode step's attention).
#[inline(always)]
fn sums4x8(k: &[f32], q: &[f32]) -> [[f32; 8]; 4] {
    assert!(
        k.len() == q.len() && k.len().is_multiple_of(32),
        "sums4x8: lengths"
    );
    #[cfg(target_arch = "x86_64")]
    if super::lanes::has_avx2_fma() {
        // SAFETY: the CPU has avx2 and fma (checked just above, with f16c); the function reads
        // through checked slices of equal length, a multiple of 32 (asserted above).
        return unsafe { sums4x8_avx2(k, q) };
    }
    let mut a = [[0.0f32; 8]; 4];
    for (kc, qc) in k.chunks_exact(32).zip(q.chunks_exact(32)) {
        for (j, acc) in a.iter_mut().enumerate() {
            for l in 0..8 {
                acc[l] = fma(kc[8 * j + l], qc[8 * j + l], acc[l]);
            }
        }
    }
    a
}

/// [`sums4x8`] in AVX2 registers. The caller checks avx2 and fma, and the lengths.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn sums4x8_avx2(k: &[f32], q: &[f32]) -> [[f32; 8]; 4] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); 4];
    for (kc, qc) in k.chunks_exact(32).zip(q.chunks_exact(32)) {
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: 8 floats at 8 j of two 32-float chunks.
            let (kv, qv) = unsafe {
                (
                    _mm256_loadu_ps(kc.as_ptr().add(8 * j)),
                    _mm256_loadu_ps(qc.as_ptr().add(8 * j)),
                )
            };
            *a = _mm256_fmadd_ps(kv, qv, *a);
        }
    }
    lanes4x8(acc)
}

/// [`dot_kq`] of an f16 K row (its bytes) in vec_dot_f16's form (never tinyBLAS: one token), the
/// row widened in registers: the same values and arithmetic as on the widened row.
///
/// # Safety
/// The CPU must have avx2, fma and f16c (`has_avx2_fma`: `KPlane::F16` is made only then).
#[inline(always)]
unsafe fn dot_kq_f16(k: &[u8], q: &[f32]) -> f32 {
    let n = q.len();
    assert!(k.len() == 2 * n, "dot_kq_f16: lengths");
    let np = n & !31;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller vouches for avx2, fma and f16c; 2 np bytes against np floats, np a
    // multiple of 32.
    let a = unsafe { sums4x8_f16_avx2(&k[..2 * np], &q[..np]) };
    #[cfg(not(target_arch = "x86_64"))]
    let a: [[f32; 8]; 4] = unreachable!("dot_kq_f16: F16C is an x86 extension");
    let mut sumf = reduce4x8(&a) as f64;
    for i in np..n {
        sumf += (f16_to_f32(u16::from_le_bytes([k[2 * i], k[2 * i + 1]])) * q[i]) as f64;
    }
    sumf as f32
}

/// Four vectors of 8 lanes as `[[f32; 8]; 4]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn lanes4x8(acc: [std::arch::x86_64::__m256; 4]) -> [[f32; 8]; 4] {
    let mut out = [[0.0f32; 8]; 4];
    for (o, a) in out.iter_mut().zip(acc) {
        // SAFETY: 8 floats into an [f32; 8].
        unsafe { std::arch::x86_64::_mm256_storeu_ps(o.as_mut_ptr(), a) };
    }
    out
}

/// [`sums4x8`] of f16 `k` (bytes, twice `q`'s length, a multiple of 32 values) in AVX2
/// registers. The caller checks avx2, fma and f16c, and the lengths.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn sums4x8_f16_avx2(k: &[u8], q: &[f32]) -> [[f32; 8]; 4] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); 4];
    for (kc, qc) in k.chunks_exact(64).zip(q.chunks_exact(32)) {
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: 16 bytes at 16 j of a 64-byte chunk and 8 floats at 8 j of a 32-float one.
            let (kv, qv) = unsafe {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(kc.as_ptr().add(16 * j) as *const __m128i)),
                    _mm256_loadu_ps(qc.as_ptr().add(8 * j)),
                )
            };
            *a = _mm256_fmadd_ps(kv, qv, *a);
        }
    }
    lanes4x8(acc)
}

/// [`dot_kq`]'s tinyBLAS form (one 8-lane accumulator, a masked leftover, `hsum8`) for `N`
/// keys at once, each key's lanes and order its own.
#[inline(always)]
fn dot_sgemm<const N: usize>(k: [&[f32]; N], q: &[f32]) -> [f32; N] {
    let n = q.len();
    let kk = n - n % 8;
    let mut acc = [[0.0f32; 8]; N];
    for c in (0..kk).step_by(8) {
        let qc = &q[c..c + 8];
        for (a, kr) in acc.iter_mut().zip(k) {
            let kc = &kr[c..c + 8];
            for i in 0..8 {
                a[i] = fma(kc[i], qc[i], a[i]);
            }
        }
    }
    if kk < n {
        for (a, kr) in acc.iter_mut().zip(k) {
            for (i, a) in a.iter_mut().enumerate() {
                let (x, y) = if kk + i < n {
                    (kr[kk + i], q[kk + i])
                } else {
                    (0.0, 0.0)
                };
                *a = fma(x, y, *a);
            }
        }
    }
    acc.map(|a| hsum8(&a))
}

/// `V·P` lane sums one lane at a time, the lane's `head_dim` sums in 512-bit registers through
/// all its keys, where the CPU has AVX-512F and `head_dim` is 64, 128 or 256: `acc[lane][d]`
/// for `lanes` lanes, visible key `vis[j]` (in slot order) adding `v[d] p[j]` to lane
/// `lane_of[j]` by one FMA (`SKIP`: to none, it is summed elsewhere). tinyBLAS's lanes are
/// `slot % 8`; vec_dot's 4 x 8 accumulators are 32 lanes, `((slot / 8) % 4) 8 + slot % 8`. Each
/// (lane, d) sees the same FMAs in the same order as key by key through memory, so the bits are
/// the same. `false` (nothing written) otherwise.
fn lane_sums_avx512(
    vis: &[usize],
    lane_of: &[u8],
    lanes: usize,
    pw: &[f32],
    vf: &[f32],
    hd: usize,
    acc: &mut [f32],
) -> bool {
    assert!(
        lane_of.len() == vis.len() && acc.len() == lanes * hd && lanes <= SKIP as usize,
        "lane_sums: shapes"
    );
    #[cfg(target_arch = "x86_64")]
    {
        // (std caches what the CPU has: these are loads of a flag.)
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma")) {
            return false;
        }
        // SAFETY: `lane_sums` needs only the avx512f and fma target features, and the CPU has
        // both (checked just above); it reaches `vf` and `acc` through checked slices.
        unsafe {
            match hd {
                64 => lane_sums::<4>(vis, lane_of, lanes, pw, vf, acc),
                128 => lane_sums::<8>(vis, lane_of, lanes, pw, vf, acc),
                256 => lane_sums::<16>(vis, lane_of, lanes, pw, vf, acc),
                _ => return false,
            }
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (vis, lane_of, lanes, pw, vf, hd, acc);
        false
    }
}

/// Whether [`lane_sums_f16`] runs here: AVX-512F and F16C, `head_dim` 64, 128 or 256.
fn lane_sums_f16_ok(hd: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!(hd, 64 | 128 | 256)
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = hd;
        false
    }
}

/// [`lane_sums_avx512`] over one token's f16 cache rows (`rows[key]`, this head's values at
/// `kvh * hd`), each widened in registers as it is read (exact: the same values as the widened
/// plane, the same FMAs in the same order). The caller checked [`lane_sums_f16_ok`].
#[allow(clippy::too_many_arguments)]
fn lane_sums_f16(
    vis: &[usize],
    lane_of: &[u8],
    lanes: usize,
    pw: &[f32],
    rows: &[&[u8]],
    kvh: usize,
    hd: usize,
    acc: &mut [f32],
) {
    assert!(
        lane_of.len() == vis.len() && acc.len() == lanes * hd && lanes <= SKIP as usize,
        "lane_sums_f16: shapes"
    );
    assert!(lane_sums_f16_ok(hd), "lane_sums_f16: not on this CPU");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `lane_sums_f16_in` needs avx512f, fma and f16c, which the CPU has (asserted just
    // above); it reads and writes through checked slices.
    unsafe {
        match hd {
            64 => lane_sums_f16_in::<4>(vis, lane_of, lanes, pw, rows, kvh, acc),
            128 => lane_sums_f16_in::<8>(vis, lane_of, lanes, pw, rows, kvh, acc),
            _ => lane_sums_f16_in::<16>(vis, lane_of, lanes, pw, rows, kvh, acc),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (pw, rows, kvh);
}

/// [`lane_sums_f16`] for `head_dim` = 16 `NV`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma,f16c")]
fn lane_sums_f16_in<const NV: usize>(
    vis: &[usize],
    lane_of: &[u8],
    lanes: usize,
    pw: &[f32],
    rows: &[&[u8]],
    kvh: usize,
    acc: &mut [f32],
) {
    use std::arch::x86_64::*;
    let hd = 16 * NV;
    let (start, by_lane) = lane_order(lane_of, lanes);
    for lane in 0..lanes {
        let mut a = [_mm512_setzero_ps(); NV];
        for &j in &by_lane[start[lane]..start[lane + 1]] {
            let p = _mm512_set1_ps(pw[j]);
            let row = &rows[vis[j]][kvh * hd * 2..(kvh + 1) * hd * 2];
            for (c, a) in a.iter_mut().enumerate() {
                // SAFETY: 32 bytes (16 f16) at 32 c of a row of 32 NV bytes (a checked slice).
                let h = unsafe { _mm256_loadu_si256(row.as_ptr().add(32 * c) as *const __m256i) };
                *a = _mm512_fmadd_ps(_mm512_cvtph_ps(h), p, *a);
            }
        }
        let out = &mut acc[lane * hd..(lane + 1) * hd];
        for (c, a) in a.iter().enumerate() {
            // SAFETY: 16 floats at 16 c of a row of 16 NV (a checked slice).
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * c), *a) };
        }
    }
}

/// The keys of each lane in order: `by_lane[start[l]..start[l + 1]]` are the `j` with
/// `lane_of[j] == l`, ascending (SKIP: in none).
fn lane_order(lane_of: &[u8], lanes: usize) -> (Vec<usize>, Vec<usize>) {
    let mut start = vec![0usize; lanes + 1];
    for &l in lane_of {
        if l != SKIP {
            start[l as usize + 1] += 1;
        }
    }
    for l in 0..lanes {
        start[l + 1] += start[l];
    }
    let mut by_lane = vec![0usize; start[lanes]];
    let mut next = start.clone();
    for (j, &l) in lane_of.iter().enumerate() {
        if l != SKIP {
            by_lane[next[l as usize]] = j;
            next[l as usize] += 1;
        }
    }
    (start, by_lane)
}

/// A key summed outside [`lane_sums_avx512`] (vec_dot's leftover keys).
const SKIP: u8 = u8::MAX;

/// [`lane_sums_avx512`] for `head_dim` = 16 `NV`. The caller checked avx512f and fma, and the
/// shapes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn lane_sums<const NV: usize>(
    vis: &[usize],
    lane_of: &[u8],
    lanes: usize,
    pw: &[f32],
    vf: &[f32],
    acc: &mut [f32],
) {
    use std::arch::x86_64::*;
    let hd = 16 * NV;
    // The keys' positions in `vis` lane by lane, each lane's in slot order.
    let (start, by_lane) = lane_order(lane_of, lanes);
    for lane in 0..lanes {
        let mut a = [_mm512_setzero_ps(); NV];
        for &j in &by_lane[start[lane]..start[lane + 1]] {
            let i = vis[j];
            let p = _mm512_set1_ps(pw[j]);
            let row = &vf[i * hd..(i + 1) * hd];
            for (c, a) in a.iter_mut().enumerate() {
                // SAFETY: 16 floats at 16 c of a row of 16 NV (a checked slice).
                let v = unsafe { _mm512_loadu_ps(row.as_ptr().add(16 * c)) };
                *a = _mm512_fmadd_ps(v, p, *a);
            }
        }
        let out = &mut acc[lane * hd..(lane + 1) * hd];
        for (c, a) in a.iter().enumerate() {
            // SAFETY: 16 floats at 16 c of a row of 16 NV (a checked slice).
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * c), *a) };
        }
    }
}

/// The V side of one KV head: widened rows `[key][d]`, or one token's f16 cache rows (the CPU
/// has AVX-512F and F16C, [`lane_sums_f16_ok`]).
enum VPlane<'a> {
    F32(&'a [f32]),
    F16 { rows: &'a [&'a [u8]], kvh: usize },
}

impl VPlane<'_> {
    /// Key `i`'s `hd` values as f32 (exact widenings), appended to `out`.
    fn push_row(&self, i: usize, hd: usize, out: &mut Vec<f32>) {
        match self {
            VPlane::F32(vf) => out.extend_from_slice(&vf[i * hd..(i + 1) * hd]),
            VPlane::F16 { rows, kvh } => out.extend(
                rows[i][kvh * hd * 2..(kvh + 1) * hd * 2]
                    .chunks_exact(2)
                    .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]]))),
            ),
        }
    }
}

/// The K side of one KV head: widened rows `[key][d]`, or the Q8_0 cache rows.
enum KPlane<'a> {
    F32(&'a [f32]),
    /// One token's f16 cache rows (`rows[key]`, every KV head's), this head's at `kvh`; made only
    /// where the CPU has AVX2, FMA and F16C (`has_avx2_fma`).
    F16 {
        rows: &'a [&'a [u8]],
        kvh: usize,
    },
    Q8_0 {
        rows: &'a [&'a [u8]],
        kvh: usize,
    },
}

/// One (token, head): scores, softmax and `V·P` over the keys (slot order) of one KV head.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn head(
    p: &AttnParams,
    n_tokens: usize,
    q: &[f32],
    q_pos: i32,
    slots: &[usize],
    kpos: &[i32],
    kp: &KPlane,
    vp: &VPlane,
    out: &mut [f32],
) {
    let hd = p.head_dim;
    let ty = p.v_type;
    // q is a permuted view: non-contiguous unless n_tokens == 1 or n_head == 1. An f32 K only reaches
    // tinyBLAS (through the first llamafile_sgemm call, on the f32 q) when q is contiguous; f16/bf16 K
    // reach it through the converted (contiguous) q whenever n_tokens >= 2.
    let sgemm_kq = n_tokens >= 2 && p.n_kv % 4 == 0 && (p.k_type != GgmlType::F32 || p.n_head == 1);
    let sgemm_vp = n_tokens >= 2 && hd % 4 == 0;

    // Q·K for the visible keys; q converted to K's vec_dot_type
    let vis: Vec<usize> = (0..slots.len())
        .filter(|&i| visible(kpos[i], q_pos, p.n_swa))
        .collect();
    assert!(
        !vis.is_empty(),
        "attention: a query at position {q_pos} sees no key"
    );
    // (plain loops, not iterator closures: the closures would be compiled outside the
    // AVX2/FMA copy this function is inlined into)
    let mut s = vec![0.0f32; vis.len()];
    match kp {
        KPlane::F32(kf) => {
            let mut qr = vec![0.0f32; hd];
            for (r, &v) in qr.iter_mut().zip(q) {
                *r = round_to(p.k_type, v);
            }
            let row = |i: usize| &kf[i * hd..(i + 1) * hd];
            let mut done = 0;
            if sgemm_kq {
                // tinyBLAS's dots 4 keys at a time: four independent FMA chains in flight
                // instead of one (each key's dot alone was bound by the FMA latency); each key's
                // arithmetic is unchanged.
                for (s4, i4) in s.chunks_exact_mut(4).zip(vis.chunks_exact(4)) {
                    s4.copy_from_slice(&dot_sgemm(
                        [row(i4[0]), row(i4[1]), row(i4[2]), row(i4[3])],
                        &qr,
                    ));
                }
                done = vis.len() / 4 * 4;
            }
            for (sj, &i) in s.iter_mut().zip(&vis).skip(done) {
                *sj = dot_kq(p.k_type, sgemm_kq, row(i), &qr);
            }
        }
        KPlane::F16 { rows, kvh } => {
            // vec_dot_f16 (one token: never tinyBLAS), the rows widened in registers.
            let mut qr = vec![0.0f32; hd];
            for (r, &v) in qr.iter_mut().zip(q) {
                *r = round_to(p.k_type, v);
            }
            for (sj, &i) in s.iter_mut().zip(&vis) {
                // SAFETY: `KPlane::F16` is made only where `has_avx2_fma` (avx2, fma, f16c).
                *sj = unsafe { dot_kq_f16(&rows[i][kvh * hd * 2..(kvh + 1) * hd * 2], &qr) };
            }
        }
        KPlane::Q8_0 { rows, kvh } => {
            // q quantized to Q8_0 per head row (from_float of the permuted q), then vec_dot_q8_0_q8_0
            // or tinyBLAS_Q0_AVX: the same bits
            let rb = hd / QK8_0 * Q8_0_BYTES;
            let mut qq = vec![0u8; rb];
            quantize_row_q8_0(q, &mut qq);
            for (sj, &i) in s.iter_mut().zip(&vis) {
                *sj = vec_dot_q0_q8_0(false, &rows[i][kvh * rb..(kvh + 1) * rb], &qq);
            }
        }
    }

    // soft_max_ext over the n_kv slots; hidden slots are -inf and give exact zeros
    for v in s.iter_mut() {
        *v = *v * p.scale + 0.0f32;
    }
    let mut max = f32::NEG_INFINITY;
    for &v in &s {
        max = if max > v { max } else { v };
    }
    let n8 = p.n_kv & !7;
    let mut e = vec![0.0f32; vis.len()];
    let mut sum = 0.0f64;
    let mut i = 0;
    while i < vis.len() {
        let slot = slots[vis[i]];
        if slot >= n8 {
            // libm tail
            let v = (s[i] - max).exp();
            e[i] = v;
            sum += v as f64;
            i += 1;
            continue;
        }
        let group = slot / 8;
        let mut lanes = [0.0f32; 8];
        while i < vis.len() && slots[vis[i]] / 8 == group && slots[vis[i]] < n8 {
            let v = v_expf(s[i] - max);
            e[i] = v;
            lanes[slots[vis[i]] % 8] = v;
            i += 1;
        }
        sum += hsum8(&lanes) as f64;
    }
    let inv = (1.0f64 / sum) as f32;
    // P, converted to V's vec_dot_type
    let pw: Vec<f32> = e.iter().map(|&v| round_to(ty, v * inv)).collect();

    // V·P: lanes by slot; accumulators laid out [lane][d] so the d loop is contiguous
    let n = p.n_kv;
    if sgemm_vp {
        // tinyBLAS: one 8-lane accumulator over k = n_kv, masked leftover, hsum8
        let VPlane::F32(vf) = vp else {
            unreachable!("attention: f16 V rows are read in place for one token only")
        };
        let mut acc = vec![0.0f32; 8 * hd];
        let lane_of: Vec<u8> = vis.iter().map(|&i| (slots[i] % 8) as u8).collect();
        if !lane_sums_avx512(&vis, &lane_of, 8, &pw, vf, hd, &mut acc) {
            for (j, &i) in vis.iter().enumerate() {
                let a = &mut acc[(slots[i] % 8) * hd..(slots[i] % 8 + 1) * hd];
                let vrow = &vf[i * hd..(i + 1) * hd];
                let pj = pw[j];
                for d in 0..hd {
                    a[d] = fma(vrow[d], pj, a[d]);
                }
            }
        }
        for (d, o) in out.iter_mut().enumerate() {
            let mut l = [0.0f32; 8];
            for (lane, v) in l.iter_mut().enumerate() {
                *v = acc[lane * hd + d];
            }
            *o = hsum8(&l);
        }
        return;
    }
    // vec_dot: 4 accumulators x 8 lanes over the first n & !31, then the type's leftover loop
    let np = n & !31;
    let mut acc = vec![0.0f32; 32 * hd];
    // The leftover keys: (j, i, their values' place in `tail_v`).
    let mut tail: Vec<(usize, usize, usize)> = Vec::new();
    let mut tail_v: Vec<f32> = Vec::new();
    // Each key's accumulator (lane) of the 4 x 8, or SKIP for the leftover keys.
    let lane_of: Vec<u8> = vis
        .iter()
        .map(|&i| {
            let slot = slots[i];
            if slot >= np {
                SKIP
            } else {
                (((slot / 8) % 4) * 8 + slot % 8) as u8
            }
        })
        .collect();
    let in_registers = match vp {
        VPlane::F32(vf) => lane_sums_avx512(&vis, &lane_of, 32, &pw, vf, hd, &mut acc),
        VPlane::F16 { rows, kvh } => {
            lane_sums_f16(&vis, &lane_of, 32, &pw, rows, *kvh, hd, &mut acc);
            true
        }
    };
    for (j, &i) in vis.iter().enumerate() {
        if lane_of[j] == SKIP {
            tail.push((j, i, tail.len()));
            vp.push_row(i, hd, &mut tail_v);
            continue;
        }
        if in_registers {
            continue;
        }
        let VPlane::F32(vf) = vp else {
            unreachable!("attention: f16 V rows are summed in registers")
        };
        let r = lane_of[j] as usize;
        let a = &mut acc[r * hd..(r + 1) * hd];
        let vrow = &vf[i * hd..(i + 1) * hd];
        let pj = pw[j];
        for d in 0..hd {
            a[d] = fma(vrow[d], pj, a[d]);
        }
    }
    let rem = n - np;
    let vec_end = np + (rem & !7) + if rem % 8 >= 4 { 4 } else { 0 };
    for (d, o) in out.iter_mut().enumerate() {
        let mut a = [[0.0f32; 8]; 4];
        for (r, ar) in a.iter_mut().enumerate() {
            for (lane, v) in ar.iter_mut().enumerate() {
                *v = acc[(r * 8 + lane) * hd + d];
            }
        }
        *o = match ty {
            GgmlType::F32 => {
                let mut sumf = reduce4x8(&a);
                // vec_dot_f32's leftovers (see vec_dot.rs): rounded products added in order up to
                // the last group of 4, contracted after; hidden slots add exact zeros
                for &(j, i, t) in &tail {
                    if slots[i] < vec_end {
                        sumf += tail_v[t * hd + d] * pw[j];
                    } else {
                        sumf = fma(tail_v[t * hd + d], pw[j], sumf);
                    }
                }
                sumf
            }
            GgmlType::F16 => {
                let mut sumf = reduce4x8(&a) as f64;
                for &(j, _, t) in &tail {
                    sumf += (tail_v[t * hd + d] * pw[j]) as f64;
                }
                sumf as f32
            }
            _ => {
                let mut v = [0.0f32; 8];
                for l in 0..8 {
                    v[l] = (a[0][l] + a[2][l]) + (a[1][l] + a[3][l]);
                }
                let mut sumf = hsum8(&v) as f64;
                for &(j, _, t) in &tail {
                    sumf += (tail_v[t * hd + d] * pw[j]) as f64;
                }
                sumf as f32
            }
        };
    }
}
