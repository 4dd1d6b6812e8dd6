//! ggml-cpu's `vec_dot` kernels (AVX2 + FMA branches), one weight row against one converted
//! activation row, with ggml's lane structure and accumulation order.
//!
//! The integer parts of the quantized dots are exact, so only what becomes a float matters: the
//! per-lane integer sums (a lane of 8 covers 4 consecutive elements of every 32), the scale
//! products, the FMA chains per lane and the final horizontal sum.

use super::lanes::{bf16_to_f32, f16_lut, fma, hsum8, rd_f16, reduce4x8};
use muser_gguf::GgmlType;

use super::quantize::{BlockQ8K, Q8_0_BYTES, QK_K};

/// `ggml_vec_dot_f32` (vec.cpp:11), AVX2 branch: 4 accumulators of 8 lanes over steps of 32 with
/// `_mm256_fmadd_ps`, `GGML_F32x8_REDUCE`, then a scalar tail `sumf += x*y` that GCC contracts to
/// an FMA (`-march=native`, `-ffp-contract=fast`).
#[inline(always)]
pub fn vec_dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len();
    let np = n & !31;
    let mut sum = [[0.0f32; 8]; 4];
    for (xc, yc) in x[..np].chunks_exact(32).zip(y[..np].chunks_exact(32)) {
        for (j, acc) in sum.iter_mut().enumerate() {
            for l in 0..8 {
                acc[l] = fma(xc[8 * j + l], yc[8 * j + l], acc[l]);
            }
        }
    }
    let mut sumf = reduce4x8(&sum);
    // the leftover loop `sumf += x[i]*y[i]` as GCC 12 compiled it (objdump of vec.cpp.o): groups of
    // 8, then one group of 4, with rounded products (`vmulps`) added in order; the last 0..3
    // elements contracted (`vfmadd231ss`)
    let rem = n - np;
    let vec_end = np + (rem & !7) + if rem % 8 >= 4 { 4 } else { 0 };
    for i in np..vec_end {
        sumf += x[i] * y[i];
    }
    for i in vec_end..n {
        sumf = fma(x[i], y[i], sumf);
    }
    sumf
}

/// `ggml_vec_dot_f16` (vec.cpp:264), AVX2/F16C branch: as [`vec_dot_f32`] on widened values, the
/// reduction is stored in a double and the tail adds exact f16 products in double.
#[inline(always)]
pub fn vec_dot_f16(x: &[u16], y: &[u16]) -> f32 {
    let lut = f16_lut();
    let f16_to_f32 = |h: u16| lut[h as usize];
    let n = x.len();
    let np = n & !31;
    let mut sum = [[0.0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, acc) in sum.iter_mut().enumerate() {
            for l in 0..8 {
                let k = i + 8 * j + l;
                acc[l] = fma(f16_to_f32(x[k]), f16_to_f32(y[k]), acc[l]);
            }
        }
    }
    let mut sumf = reduce4x8(&sum) as f64;
    for i in np..n {
        sumf += (f16_to_f32(x[i]) * f16_to_f32(y[i])) as f64;
    }
    sumf as f32
}

/// `ggml_vec_dot_bf16` (vec.cpp:139), AVX2 branch: 4 accumulators `c_j = x*y + c_j` over steps of
/// 32 (the `_mm256_add_ps(_mm256_mul_ps(..))` pair is contracted to an FMA by GCC), combined as
/// `(c1+c3)+(c2+c4)`, then `hi+lo`, `movehl`, `movehdup`; the sum is kept in a double and the tail
/// adds exact bf16 products.
#[inline(always)]
pub fn vec_dot_bf16(x: &[u16], y: &[u16]) -> f32 {
    let n = x.len();
    let np = n & !31;
    let mut c = [[0.0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, acc) in c.iter_mut().enumerate() {
            for l in 0..8 {
                let k = i + 8 * j + l;
                acc[l] = fma(bf16_to_f32(x[k]), bf16_to_f32(y[k]), acc[l]);
            }
        }
    }
    let mut v = [0.0f32; 8];
    for l in 0..8 {
        v[l] = (c[0][l] + c[2][l]) + (c[1][l] + c[3][l]);
    }
    let mut sumf = hsum8(&v) as f64;
    for i in np..n {
        sumf += (bf16_to_f32(x[i]) * bf16_to_f32(y[i])) as f64;
    }
    sumf as f32
}

/// Integer dot of 4 consecutive elements (one i32 lane of `maddubs` + `madd(1, .)`); `b` holds i8.
#[inline(always)]
fn dot4(a: &[i32; 32], b: &[u8], w: usize) -> i32 {
    let o = 4 * w;
    a[o] * b[o] as i8 as i32
        + a[o + 1] * b[o + 1] as i8 as i32
        + a[o + 2] * b[o + 2] as i8 as i32
        + a[o + 3] * b[o + 3] as i8 as i32
}

/// Q8_0 / Q4_0 against Q8_0: per block `d = fp16(x.d) * fp16(y.d)`, per lane
/// `acc = fma(d, (float) isum_lane, acc)`, then [`hsum8`]. This is both `ggml_vec_dot_q8_0_q8_0`
/// / `ggml_vec_dot_q4_0_q8_0` (quants.c:701, 1308) and tinyBLAS_Q0_AVX (sgemm.cpp:1444): the same
/// arithmetic per output element.
#[inline(always)]
pub fn vec_dot_q0_q8_0(ty_is_q4_0: bool, x: &[u8], y: &[u8]) -> f32 {
    let nb = y.len() / Q8_0_BYTES;
    let xbs = if ty_is_q4_0 { 18 } else { Q8_0_BYTES };
    let mut acc = [0.0f32; 8];
    let mut a = [0i32; 32];
    for ib in 0..nb {
        let xb = &x[ib * xbs..(ib + 1) * xbs];
        let yb = &y[ib * Q8_0_BYTES..(ib + 1) * Q8_0_BYTES];
        let d = rd_f16(xb, 0) * rd_f16(yb, 0);
        if ty_is_q4_0 {
            for j in 0..16 {
                a[j] = (xb[2 + j] & 0x0F) as i32 - 8;
                a[j + 16] = (xb[2 + j] >> 4) as i32 - 8;
            }
        } else {
            for j in 0..32 {
                a[j] = xb[2 + j] as i8 as i32;
            }
        }
        let yq = &yb[2..34];
        for (w, lane) in acc.iter_mut().enumerate() {
            *lane = fma(d, dot4(&a, yq, w) as f32, *lane);
        }
    }
    hsum8(&acc)
}

/// The 8 scales and 8 mins of a Q4_K / Q5_K block (the `utmp` / `kmask` unpacking), as i32.
#[inline(always)]
pub fn k4_scales_mins(q: &[u8]) -> ([i32; 8], [i32; 8]) {
    let mut sc = [0i32; 8];
    let mut mn = [0i32; 8];
    for j in 0..8 {
        let (s, m) = if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            (
                (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
                (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
            )
        };
        sc[j] = s as i32;
        mn[j] = m as i32;
    }
    (sc, mn)
}

/// Unsigned codes (0..15 or 0..31) of one Q4_K / Q5_K block in element order.
#[inline(always)]
pub fn k4_codes(ty5: bool, xb: &[u8], q: &mut [i32; QK_K]) {
    let (qh, qs) = if ty5 {
        (&xb[16..48], &xb[48..176])
    } else {
        (&xb[0..0], &xb[16..144])
    };
    for j in 0..4 {
        for l in 0..32 {
            let b = qs[32 * j + l];
            let (mut lo, mut hi) = ((b & 0x0F) as i32, (b >> 4) as i32);
            if ty5 {
                lo |= (((qh[l] >> (2 * j)) & 1) as i32) << 4;
                hi |= (((qh[l] >> (2 * j + 1)) & 1) as i32) << 4;
            }
            q[64 * j + l] = lo;
            q[64 * j + 32 + l] = hi;
        }
    }
}

/// Codes of one Q6_K block in element order, unbiased (0..63).
#[inline(always)]
pub fn q6_codes(xb: &[u8], q: &mut [i32; QK_K]) {
    for n in 0..2 {
        let ql = &xb[64 * n..64 * n + 64];
        let qh = &xb[128 + 32 * n..128 + 32 * n + 32];
        let o = &mut q[128 * n..128 * n + 128];
        for l in 0..32 {
            o[l] = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32;
            o[l + 32] = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32;
            o[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32;
            o[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32;
        }
    }
}

/// One K-quant block decoded once and reused for every input column: codes in element order
/// (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63, unbiased), sub-block scales (8 or 16) and mins (8), and the
/// f16 super-block scales widened.
#[derive(Clone, Debug)]
pub struct KBlock {
    pub q: [i32; QK_K],
    pub sc: [i32; 16],
    pub mn: [i32; 8],
    pub d: f32,
    pub dmin: f32,
}

impl KBlock {
    pub const ZERO: KBlock = KBlock {
        q: [0; QK_K],
        sc: [0; 16],
        mn: [0; 8],
        d: 0.0,
        dmin: 0.0,
    };

    /// Decode one block of `ty` (Q4_K, Q5_K or Q6_K).
    #[inline(always)]
    pub fn decode(ty: GgmlType, xb: &[u8], out: &mut KBlock) {
        match ty {
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let (sc, mn) = k4_scales_mins(&xb[4..16]);
                out.sc[..8].copy_from_slice(&sc);
                out.mn = mn;
                out.d = rd_f16(xb, 0);
                out.dmin = rd_f16(xb, 2);
                k4_codes(ty == GgmlType::Q5_K, xb, &mut out.q);
            }
            GgmlType::Q6_K => {
                for (s, &b) in out.sc.iter_mut().zip(&xb[192..208]) {
                    *s = b as i8 as i32;
                }
                out.d = rd_f16(xb, 208);
                q6_codes(xb, &mut out.q);
            }
            t => panic!("KBlock::decode: {t} is not a K-quant"),
        }
    }
}

/// Decode a row of `ty` blocks into `out` (resized).
pub fn decode_k_row(ty: GgmlType, x: &[u8], out: &mut Vec<KBlock>) {
    let bs = ty.type_size();
    out.resize(x.len() / bs, KBlock::ZERO);
    for (xb, b) in x.chunks_exact(bs).zip(out.iter_mut()) {
        KBlock::decode(ty, xb, b);
    }
}

/// Per-lane integer sums of `sc[s] * Σ code*q8` over a 256 block: lane `w` collects elements
/// `4w..4w+4` of every 32, each weighted by the scale of its sub-block (sub-blocks of `sub` = 16 or
/// 32 values). This is what `maddubs` + `madd(scale, .)` + `add_epi32` leave in the 8 i32 lanes.
#[inline(always)]
fn lane_sums(q: &[i32; QK_K], y: &[i8; QK_K], sc: &[i32], sub: usize) -> [i32; 8] {
    // products, then sums of 4, then lane w of chunk c gets group 8c + w
    let mut g = [0i32; QK_K / 4];
    for (i, gi) in g.iter_mut().enumerate() {
        let e = 4 * i;
        *gi = q[e] * y[e] as i32
            + q[e + 1] * y[e + 1] as i32
            + q[e + 2] * y[e + 2] as i32
            + q[e + 3] * y[e + 3] as i32;
    }
    let mut s = [0i32; 8];
    for c in 0..QK_K / 32 {
        for (w, lane) in s.iter_mut().enumerate() {
            *lane += sc[(32 * c + 4 * w) / sub] * g[8 * c + w];
        }
    }
    s
}

/// `ggml_vec_dot_q4_K_q8_K` (quants.c:2038), AVX2 branch, one block.
#[inline(always)]
fn q4k_block(b: &KBlock, yb: &BlockQ8K, acc: &mut [f32; 8], acc_m: &mut [f32; 4]) {
    let s = lane_sums(&b.q, &yb.qs, &b.sc, 32);
    q4k_finish(b.d, b.dmin, &b.mn, yb, &s, acc, acc_m);
}

/// The float part of [`q4k_block`], given the block's lane sums `s`.
#[inline(always)]
fn q4k_finish(
    bd: f32,
    bdmin: f32,
    mn: &[i32; 8],
    yb: &BlockQ8K,
    s: &[i32; 8],
    acc: &mut [f32; 8],
    acc_m: &mut [f32; 4],
) {
    let dmin = -yb.d * bdmin;
    for (a, prod) in acc_m.iter_mut().zip(k4_min_products(mn, yb)) {
        *a = fma(dmin, prod as f32, *a);
    }
    lanes_fma(yb.d * bd, s, acc);
}

/// A Q4_K / Q5_K block's mins against the Q8_K sums, per pair of its sub-blocks (t = 0..3:
/// sub-blocks 2t and 2t + 1, `prod` of ggml's kernels).
#[inline(always)]
fn k4_min_products(mn: &[i32; 8], yb: &BlockQ8K) -> [i32; 4] {
    std::array::from_fn(|t| {
        let q8s0 = yb.bsums[4 * t] as i32 + yb.bsums[4 * t + 1] as i32;
        let q8s1 = yb.bsums[4 * t + 2] as i32 + yb.bsums[4 * t + 3] as i32;
        mn[2 * t] * q8s0 + mn[2 * t + 1] * q8s1
    })
}

/// `acc = fma(d, (float) s, acc)` in each of the 8 lanes (a block's scaled integer sums).
#[inline(always)]
fn lanes_fma(d: f32, s: &[i32; 8], acc: &mut [f32; 8]) {
    for w in 0..8 {
        acc[w] = fma(d, s[w] as f32, acc[w]);
    }
}

/// `ggml_vec_dot_q5_K_q8_K` (quants.c:2216), AVX2 branch, one block: the mins go to a scalar
/// `summs += dmin * (float) Σprod`, contracted to an FMA by GCC.
#[inline(always)]
fn q5k_block(b: &KBlock, yb: &BlockQ8K, acc: &mut [f32; 8], summs: &mut f32) {
    let s = lane_sums(&b.q, &yb.qs, &b.sc, 32);
    q5k_finish(b.d, b.dmin, &b.mn, yb, &s, acc, summs);
}

/// The float part of [`q5k_block`], given the block's lane sums `s`.
#[inline(always)]
fn q5k_finish(
    bd: f32,
    bdmin: f32,
    mn: &[i32; 8],
    yb: &BlockQ8K,
    s: &[i32; 8],
    acc: &mut [f32; 8],
    summs: &mut f32,
) {
    let dmin = -yb.d * bdmin;
    let p = k4_min_products(mn, yb);
    let hsum = (p[0] + p[1]) + (p[2] + p[3]);
    *summs = fma(dmin, hsum as f32, *summs);
    lanes_fma(yb.d * bd, s, acc);
}

/// `ggml_vec_dot_q6_K_q8_K` (quants.c:2426), AVX2 branch, one block: codes 0..63 against q8, minus
/// `32 * Σ bsums*scales` per lane (`q8sclsub`: lane `w` holds sub-blocks `2w`, `2w+1`).
#[inline(always)]
fn q6k_block(b: &KBlock, yb: &BlockQ8K, acc: &mut [f32; 8]) {
    let s = lane_sums(&b.q, &yb.qs, &b.sc, 16);
    q6k_finish(b.d, &b.sc, yb, s, acc);
}

/// The rest of [`q6k_block`], given the lane sums `s` of the unbiased codes.
#[inline(always)]
fn q6k_finish(bd: f32, sc: &[i32; 16], yb: &BlockQ8K, mut s: [i32; 8], acc: &mut [f32; 8]) {
    for (w, lane) in s.iter_mut().enumerate() {
        let sub = yb.bsums[2 * w] as i32 * sc[2 * w] + yb.bsums[2 * w + 1] as i32 * sc[2 * w + 1];
        *lane -= sub << 5;
    }
    lanes_fma(yb.d * bd, &s, acc);
}

/// The AVX2 `vec_dot` of a K-quant row (decoded blocks) against a Q8_K row.
#[inline(always)]
pub fn vec_dot_k(ty: GgmlType, x: &[KBlock], y: &[BlockQ8K]) -> f32 {
    let mut acc = [0.0f32; 8];
    match ty {
        GgmlType::Q4_K => {
            let mut acc_m = [0.0f32; 4];
            for (b, yb) in x.iter().zip(y) {
                q4k_block(b, yb, &mut acc, &mut acc_m);
            }
            hsum8(&acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
        }
        GgmlType::Q5_K => {
            let mut summs = 0.0f32;
            for (b, yb) in x.iter().zip(y) {
                q5k_block(b, yb, &mut acc, &mut summs);
            }
            hsum8(&acc) + summs
        }
        GgmlType::Q6_K => {
            for (b, yb) in x.iter().zip(y) {
                q6k_block(b, yb, &mut acc);
            }
            hsum8(&acc)
        }
        t => panic!("vec_dot_k: {t} is not a K-quant"),
    }
}

#[inline(always)]
fn vec_dot_k_bytes(ty: GgmlType, x: &[u8], y: &[BlockQ8K]) -> f32 {
    let mut blocks = Vec::new();
    decode_k_row(ty, x, &mut blocks);
    vec_dot_k(ty, &blocks, y)
}

/// `ggml_vec_dot_q4_K_q8_K` of a raw Q4_K row.
pub fn vec_dot_q4_k(x: &[u8], y: &[BlockQ8K]) -> f32 {
    vec_dot_k_bytes(GgmlType::Q4_K, x, y)
}

/// `ggml_vec_dot_q5_K_q8_K` of a raw Q5_K row.
pub fn vec_dot_q5_k(x: &[u8], y: &[BlockQ8K]) -> f32 {
    vec_dot_k_bytes(GgmlType::Q5_K, x, y)
}

/// `ggml_vec_dot_q6_K_q8_K` of a raw Q6_K row.
pub fn vec_dot_q6_k(x: &[u8], y: &[BlockQ8K]) -> f32 {
    vec_dot_k_bytes(GgmlType::Q6_K, x, y)
}

/// [`vec_dot_k`] of a Q4_K, Q5_K or Q6_K row straight from its bytes: the blocks' lane sums by AVX2
/// integer products (`maddubs`, then `madd` by each sub-block's scale, as ggml's kernels form
/// them) instead of codes decoded into a [`KBlock`] first. The lane sums are exact integers either
/// way (no pair of products leaves i16: codes below 64 against |q8| <= 128), and the float
/// steps are those of [`q4k_finish`] / [`q5k_finish`] / [`q6k_finish`] in the same order, kept in
/// vector registers, so the bits are the same. For
/// products of fewer than 8 tokens (`vec_dot`'s path: decode), whose rows are read once per
/// token. `None` where the CPU lacks AVX2 or for another type.
pub fn vec_dot_k_packed(ty: GgmlType, x: &[u8], y: &[BlockQ8K]) -> Option<f32> {
    #[cfg(target_arch = "x86_64")]
    if super::lanes::has_avx2_fma()
        && matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
    {
        // SAFETY: the avx2, fma and f16c target features the function enables are present (checked
        // just above); it reads only within `x` and `y` (whole blocks, checked inside).
        return Some(unsafe { packed::vec_dot(ty, x, y) });
    }
    let _ = (ty, x, y);
    None
}

/// What the tiled K-quant kernel reads of its tokens besides their codes, arranged once for all
/// the rows of a product: their scales and sums of codes, 8 tokens side by side, and where the
/// CPU has AVX-512 VNNI, their codes too, 4 at a time for 16 tokens (see
/// [`tiled_rows_k_packed_with`]).
pub struct TiledSums {
    #[cfg(target_arch = "x86_64")]
    groups: Vec<packed::GroupSums>,
    /// `[pair of groups][block][j]`: bytes 4j..4j+4 of the block's codes for each of the 16
    /// tokens of groups 2p and 2p + 1 (zeros past the last group), token k's in i32 lane k (the
    /// operand `vpdpbusd` takes); empty without VNNI.
    #[cfg(target_arch = "x86_64")]
    quads: Vec<[std::arch::x86_64::__m512i; 64]>,
    vnni: bool,
    ty: GgmlType,
    nt: usize,
}

/// Whether the CPU has the AVX-512 instructions the tiled kernel's VNNI form uses (`vpdpbusd`
/// on 512-bit vectors: avx512f, avx512vl and avx512vnni) besides AVX2 and FMA.
pub fn has_avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            super::lanes::has_avx2_fma()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl TiledSums {
    /// The sums of `nt` tokens' Q8_K rows `y` (one after another) for weights of type `ty`,
    /// for the VNNI form of the kernel where the CPU has it; `None` where the CPU lacks AVX2 or
    /// for another type (then the tiled kernel is not taken from the rows' bytes).
    pub fn new(ty: GgmlType, y: &[BlockQ8K], nt: usize) -> Option<TiledSums> {
        Self::build(ty, y, nt, has_avx512_vnni())
    }

    /// As [`TiledSums::new`], for the AVX2 form of the kernel whatever the CPU (the tests
    /// compare both forms with the decoded blocks).
    pub fn new_avx2(ty: GgmlType, y: &[BlockQ8K], nt: usize) -> Option<TiledSums> {
        Self::build(ty, y, nt, false)
    }

    /// Whether the kernel takes its VNNI form for these sums.
    pub fn vnni(&self) -> bool {
        self.vnni
    }

    fn build(ty: GgmlType, y: &[BlockQ8K], nt: usize, vnni: bool) -> Option<TiledSums> {
        #[cfg(target_arch = "x86_64")]
        if super::lanes::has_avx2_fma()
            && matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
            && nt > 0
            && y.len() % nt == 0
        {
            let nb = y.len() / nt;
            return Some(TiledSums {
                groups: packed::group_sums(ty, y, nb, nt),
                quads: if vnni {
                    packed::group_quads(y, nb, nt)
                } else {
                    Vec::new()
                },
                vnni,
                ty,
                nt,
            });
        }
        let _ = (ty, y, nt, vnni);
        None
    }
}

/// [`super::tiled::tiled_dot_k`] of each of the Q4_K, Q5_K or Q6_K rows `w` (`rb` bytes each)
/// straight from their bytes against each of `n` tokens' Q8_K rows (`y`, one after another), into
/// `out` (row-major, `[row][token]`, `n = out.len() / rows`), as [`tiled_rows_k_packed_with`]
/// with the tokens' sums arranged here. `false` (nothing written) where the CPU lacks AVX2 or for
/// another type.
pub fn tiled_rows_k_packed(
    ty: GgmlType,
    w: &[u8],
    rb: usize,
    y: &[BlockQ8K],
    out: &mut [f32],
) -> bool {
    let rows = w.len() / rb.max(1);
    if rows == 0 {
        return false;
    }
    match TiledSums::new(ty, y, out.len() / rows) {
        Some(sums) => tiled_rows_k_packed_with(&sums, w, rb, y, out, OutLayout::RowToken),
        None => false,
    }
}

/// How a product's outputs are laid out: `[row][token]` or `[token][row]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutLayout {
    RowToken,
    TokenRow,
}

/// [`tiled_rows_k_packed`] with the tokens' [`TiledSums`] arranged beforehand (once for every
/// chunk of rows of a product). Each row's blocks are decoded once for all the tokens, into a
/// buffer read from L1 (codes, scale vectors, the mins' or scales' pairs). Each group of 8
/// tokens' `s1`: in the AVX2 form, the sum of `maddubs`/`madd` products' lanes, 8 tokens side
/// by side; in the VNNI form (where the CPU has AVX-512 VNNI), `vpdpbusd` of a row's 4 codes
/// against 16 tokens' 4 codes (two groups), each token's sums in its own lane, times each sub-block's
/// scale, 8 rows at a time. `s2` (or Q6_K's code bias): one `madd` per pair of sub-blocks
/// against the group's arranged sums. Then the tiled kernel's float steps in block order, each
/// token's in its own lane. `s1` and `s2` are exact integers however they are summed, and the
/// float steps are the same, so the bits are those of decoded blocks. For products of 8 tokens
/// or more (the tiled path: prompts). `out` is `[row][token]` or `[token][row]` (`layout`).
/// `false` (nothing written) where the shapes do not match the sums.
pub fn tiled_rows_k_packed_with(
    sums: &TiledSums,
    w: &[u8],
    rb: usize,
    y: &[BlockQ8K],
    out: &mut [f32],
    layout: OutLayout,
) -> bool {
    let rows = w.len() / rb.max(1);
    if rows == 0 || out.len() != rows * sums.nt || y.len() % sums.nt != 0 {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `TiledSums` exists only where avx2 and fma are present (its constructor
        // checks), holds `quads` only where AVX-512 VNNI is present too (checked by
        // `has_avx512_vnni`), and only for a K-quant; the function reads only within `w`, `y`
        // and the sums (whole blocks, the shapes checked inside).
        unsafe {
            packed::tiled_rows(
                sums.ty,
                w,
                rb,
                y,
                &sums.groups,
                &sums.quads,
                out,
                layout == OutLayout::TokenRow,
            )
        };
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (w, y, out, layout);
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod packed {
    use super::{BlockQ8K, GgmlType, QK_K, fma, hsum8};
    use crate::cpu::ggml::lanes::rd_f16;
    use std::arch::x86_64::*;

    /// The 8 scales (bytes 0..8) and 8 mins (bytes 8..16) of a Q4_K / Q5_K block from its 12 scale
    /// bytes, by ggml's `utmp` / `kmask` steps: the values [`super::k4_scales_mins`] gives.
    #[inline(always)]
    fn k4_utmp(q: &[u8]) -> [u32; 4] {
        const K1: u32 = 0x3f3f_3f3f;
        const K2: u32 = 0x0f0f_0f0f;
        const K3: u32 = 0x0303_0303;
        let r = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
        let (u0, u1, u2) = (r(0), r(1), r(2));
        [
            u0 & K1,
            (u2 & K2) | (((u0 >> 6) & K3) << 4),
            u1 & K1,
            ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4),
        ]
    }

    /// A Q4_K / Q5_K block's scales (low 128 bits: 8 x i16) and mins (high 128 bits).
    #[target_feature(enable = "avx2")]
    fn k4_scales_mins_v(q: &[u8]) -> __m256i {
        let u = k4_utmp(q);
        _mm256_cvtepu8_epi16(_mm_set_epi32(
            u[3] as i32,
            u[2] as i32,
            u[1] as i32,
            u[0] as i32,
        ))
    }

    /// i16 element `k` of each 128-bit half of `v`, in all 16 of that half's elements.
    #[target_feature(enable = "avx2")]
    fn bcast16(v: __m256i, k: usize) -> __m256i {
        let b = (2 * k) as i16;
        _mm256_shuffle_epi8(v, _mm256_set1_epi16(((b + 1) << 8) | b))
    }

    /// A Q4_K / Q5_K block's mins against the Q8_K sums (`prod` of ggml's kernels): lane t holds
    /// `min[2t] * (bsums[4t] + bsums[4t+1]) + min[2t+1] * (bsums[4t+2] + bsums[4t+3])`.
    #[target_feature(enable = "avx2")]
    fn k4_min_products_v(ms: __m256i, yb: &BlockQ8K) -> __m128i {
        // SAFETY: 16 i16 sums, 32 bytes.
        let bs = unsafe { _mm256_loadu_si256(yb.bsums.as_ptr() as *const __m256i) };
        let q8s = _mm_hadd_epi16(
            _mm256_castsi256_si128(bs),
            _mm256_extracti128_si256::<1>(bs),
        );
        _mm_madd_epi16(_mm256_extracti128_si256::<1>(ms), q8s)
    }

    /// A Q4_K / Q5_K block's codes (0..15, or 0..31 with Q5_K's fifth bits `qh`) as 8 vectors
    /// of 32 bytes in element order: vector k holds elements 32k..32k+32.
    #[target_feature(enable = "avx2")]
    fn k4_codes_v(qs: &[u8], qh: Option<&[u8]>) -> [__m256i; 8] {
        assert!(qs.len() >= 128 && qh.is_none_or(|h| h.len() >= 32));
        let (m4, m16) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
        // SAFETY: 32 bytes of qh (checked above).
        let hbits = qh.map(|h| unsafe { _mm256_loadu_si256(h.as_ptr() as *const __m256i) });
        // 16 where bit `b` of a byte of qh is set (Q5_K's fifth bit of a code), else 0.
        let fifth = |b: usize| match hbits {
            Some(h) => {
                let bit = _mm256_set1_epi8((1u8 << b) as i8);
                _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit), m16)
            }
            None => _mm256_setzero_si256(),
        };
        let mut c = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            // SAFETY: bytes 32j..32j+32 of the 128 codes: in range.
            let bits = unsafe { _mm256_loadu_si256(qs.as_ptr().add(32 * j) as *const __m256i) };
            c[2 * j] = _mm256_or_si256(_mm256_and_si256(bits, m4), fifth(2 * j));
            c[2 * j + 1] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4),
                fifth(2 * j + 1),
            );
        }
        c
    }

    /// The scale of each 32 of a Q4_K / Q5_K block (`ms`: [`k4_scales_mins_v`]) in all 16 i16
    /// elements of vector k.
    #[target_feature(enable = "avx2")]
    fn k4_scales8(ms: __m256i) -> [__m256i; 8] {
        // The 8 scales in both 128-bit halves (the shuffles stay within a half).
        let sc = _mm256_permute2x128_si256::<0x00>(ms, ms);
        std::array::from_fn(|k| bcast16(sc, k))
    }

    /// A Q6_K block's codes (0..63, unbiased) as 8 vectors of 32 bytes in element order.
    #[target_feature(enable = "avx2")]
    fn q6k_codes_v(xb: &[u8]) -> [__m256i; 8] {
        assert!(xb.len() >= 192);
        let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        let mut c = [_mm256_setzero_si256(); 8];
        for n in 0..2 {
            // SAFETY: ql bytes 64n..64n+64 and qh bytes 128+32n..+32 of the block: in range.
            let (ql0, ql1, qh) = unsafe {
                (
                    _mm256_loadu_si256(xb.as_ptr().add(64 * n) as *const __m256i),
                    _mm256_loadu_si256(xb.as_ptr().add(64 * n + 32) as *const __m256i),
                    _mm256_loadu_si256(xb.as_ptr().add(128 + 32 * n) as *const __m256i),
                )
            };
            // The four 32s of this half, in element order (vec_dot.rs q6_codes).
            c[4 * n] = _mm256_or_si256(
                _mm256_and_si256(ql0, m4),
                _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m30),
            );
            c[4 * n + 1] = _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m30),
            );
            c[4 * n + 2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                _mm256_and_si256(qh, m30),
            );
            c[4 * n + 3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
            );
        }
        c
    }

    /// A Q6_K block's scales (sub-blocks of 16): vector c takes scale 2c in its low 128 bits
    /// and 2c + 1 in its high 128 bits; and the 16 scales as i16 in order.
    #[target_feature(enable = "avx2")]
    fn q6k_scales8(xb: &[u8]) -> ([__m256i; 8], __m256i) {
        // SAFETY: bytes 192..208 of a 210-byte block (the caller's chunk).
        let s8 = unsafe { _mm_loadu_si128(xb[192..208].as_ptr() as *const __m128i) };
        let all = _mm256_cvtepi8_epi16(s8);
        // [s0..s7 | s0..s7] and [s8..s15 | s8..s15].
        let halves = [
            _mm256_permute2x128_si256::<0x00>(all, all),
            _mm256_permute2x128_si256::<0x11>(all, all),
        ];
        let sc = std::array::from_fn(|c| {
            let e = (2 * (c % 4)) as i16;
            let pat = _mm256_set_m128i(
                _mm_set1_epi16(((2 * e + 3) << 8) | (2 * e + 2)),
                _mm_set1_epi16(((2 * e + 1) << 8) | (2 * e)),
            );
            _mm256_shuffle_epi8(halves[c / 4], pat)
        });
        (sc, all)
    }

    /// What a Q6_K block's lane sums of unbiased codes exceed the biased codes' by, given the
    /// block's 16 scales `all` ([`q6k_scales8`]): 32 (bsums[2w] sc[2w] + bsums[2w+1] sc[2w+1]) in
    /// lane w (ggml's `q8sclsub`), the bias through the sums of 16 (one per sub-block).
    #[target_feature(enable = "avx2")]
    fn q6k_bias(yb: &BlockQ8K, all: __m256i) -> __m256i {
        // SAFETY: 16 i16 sums, 32 bytes.
        let bsums = unsafe { _mm256_loadu_si256(yb.bsums.as_ptr() as *const __m256i) };
        _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, all))
    }

    /// A Q4_K or Q5_K block's codes ([`k4_codes_v`], Q5_K's with its fifth bits).
    #[target_feature(enable = "avx2")]
    fn k4_block_codes(ty: GgmlType, xb: &[u8]) -> [__m256i; 8] {
        if ty == GgmlType::Q5_K {
            k4_codes_v(&xb[48..176], Some(&xb[16..48]))
        } else {
            k4_codes_v(&xb[16..144], None)
        }
    }

    /// Lane sums of a block's codes against `y`, each 32 weighted by its scale: lane w holds
    /// elements 4w..4w+3 of every 32 (ggml's `maddubs` then `madd` by the scales). Exact: no pair
    /// of products leaves i16 (codes below 64 against |q8| <= 128).
    #[target_feature(enable = "avx2")]
    fn dot8(codes: &[__m256i; 8], scales: &[__m256i; 8], y: &[i8; QK_K]) -> __m256i {
        let mut sum = _mm256_setzero_si256();
        for k in 0..8 {
            // SAFETY: elements 32k..32k+32 of y.
            let yv = unsafe { _mm256_loadu_si256(y.as_ptr().add(32 * k) as *const __m256i) };
            let p = _mm256_madd_epi16(scales[k], _mm256_maddubs_epi16(codes[k], yv));
            sum = _mm256_add_epi32(sum, p);
        }
        sum
    }

    /// The 8 lanes of `v` (i32) summed; exact (the callers' sums fit an i32).
    #[target_feature(enable = "avx2")]
    fn hsum_i32(v: __m256i) -> i32 {
        hsum_i32x4(_mm_add_epi32(
            _mm256_castsi256_si128(v),
            _mm256_extracti128_si256::<1>(v),
        ))
    }

    /// The 4 lanes of `s` (i32) summed; exact.
    #[target_feature(enable = "avx2")]
    fn hsum_i32x4(s: __m128i) -> i32 {
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }

    /// One block of a weight row as the tiled kernel reads it, decoded once for all the tokens:
    /// its codes and scale vectors for [`dot8x8`] (kept in memory, read from L1 for each group
    /// of 8 tokens, so that the group's 8 accumulators, one code vector and one scale vector are
    /// what the inner loop holds in registers), and the i16 pairs the `madd` against the group's
    /// sums takes (Q4_K / Q5_K: the mins `(min[2p], min[2p+1])`, p < 4; Q6_K: the scales
    /// `(sc[2p], sc[2p+1])`, p < 8).
    #[derive(Clone, Copy)]
    struct RowBlock {
        codes: [__m256i; 8],
        scales: [__m256i; 8],
        /// [`k4_scales_mins_v`] (Q4_K, Q5_K) or the 16 scales as i16 (Q6_K), for one token.
        ms: __m256i,
        pairs: [i32; 8],
        /// The sub-blocks' scales (Q4_K / Q5_K: 8, Q6_K: 16), for the VNNI form.
        sc: [i32; 16],
        d: f32,
        dmin: f32,
    }

    impl RowBlock {
        const ZERO: RowBlock = RowBlock {
            codes: [unsafe_zero(); 8],
            scales: [unsafe_zero(); 8],
            ms: unsafe_zero(),
            pairs: [0; 8],
            sc: [0; 16],
            d: 0.0,
            dmin: 0.0,
        };
    }

    /// An all-zero vector as a constant.
    const fn unsafe_zero() -> __m256i {
        // SAFETY: __m256i is plain data (four i64); every bit pattern, all zeros included, is a
        // valid value.
        unsafe { std::mem::transmute::<[i64; 4], __m256i>([0; 4]) }
    }

    /// Two i16 as the i32 whose low half is `a` (a `madd` operand).
    fn pair(a: i16, b: i16) -> i32 {
        ((a as u16 as u32) | ((b as u16 as u32) << 16)) as i32
    }

    /// Decode one Q4_K, Q5_K or Q6_K block into `o`; its scale vectors (`scales`, and Q6_K's
    /// `ms`) only with `vectors` (the AVX2 form's products read them, the VNNI form's do not).
    #[target_feature(enable = "avx2")]
    fn row_block(ty: GgmlType, xb: &[u8], o: &mut RowBlock, vectors: bool) {
        if ty == GgmlType::Q6_K {
            let sc: [i16; 16] = std::array::from_fn(|s| xb[192 + s] as i8 as i16);
            o.codes = q6k_codes_v(xb);
            if vectors {
                (o.scales, o.ms) = q6k_scales8(xb);
            }
            o.pairs = std::array::from_fn(|p| pair(sc[2 * p], sc[2 * p + 1]));
            o.sc = std::array::from_fn(|s| sc[s] as i32);
            o.d = rd_f16(xb, 208);
            o.dmin = 0.0;
        } else {
            let ms = k4_scales_mins_v(&xb[4..16]);
            let mut v = [0i16; 16];
            // SAFETY: 32 bytes into an [i16; 16].
            unsafe { _mm256_storeu_si256(v.as_mut_ptr() as *mut __m256i, ms) };
            let mins = &v[8..];
            o.codes = k4_block_codes(ty, xb);
            if vectors {
                o.scales = k4_scales8(ms);
            }
            o.ms = ms;
            o.pairs = std::array::from_fn(|p| {
                if p < 4 {
                    pair(mins[2 * p], mins[2 * p + 1])
                } else {
                    0
                }
            });
            o.sc = std::array::from_fn(|s| if s < 8 { v[s] as i32 } else { 0 });
            o.d = rd_f16(xb, 0);
            o.dmin = rd_f16(xb, 2);
        }
    }

    /// What one block of 8 tokens brings to the tiled kernel besides its codes, laid out for
    /// the 8 tokens side by side: their scales `d`, and the sums of their codes as i16 pairs,
    /// token k's in elements 2k and 2k + 1 of each vector: for Q4_K / Q5_K the sums of 32
    /// (`bsums[2s] + bsums[2s+1]`, at most 4,064) of sub-blocks (2p, 2p + 1), p < 4; for Q6_K
    /// the sums of 16 of sub-blocks (2p, 2p + 1), p < 8.
    #[derive(Clone, Copy)]
    pub(super) struct GroupSums {
        yd: [f32; 8],
        pairs: [[i16; 16]; 8],
    }

    /// [`GroupSums`] of every block of every whole group of 8 tokens (`[group][block]`).
    pub(super) fn group_sums(ty: GgmlType, y: &[BlockQ8K], nb: usize, nt: usize) -> Vec<GroupSums> {
        let q6 = ty == GgmlType::Q6_K;
        let mut g = Vec::with_capacity(nt / 8 * nb);
        for t0 in (0..nt / 8 * 8).step_by(8) {
            for b in 0..nb {
                let mut e = GroupSums {
                    yd: [0.0; 8],
                    pairs: [[0; 16]; 8],
                };
                for k in 0..8 {
                    let yb = &y[(t0 + k) * nb + b];
                    e.yd[k] = yb.d;
                    for p in 0..8 {
                        let (a, c) = if q6 {
                            (yb.bsums[2 * p], yb.bsums[2 * p + 1])
                        } else if p < 4 {
                            let s32 = |s: usize| yb.bsums[2 * s] + yb.bsums[2 * s + 1];
                            (s32(2 * p), s32(2 * p + 1))
                        } else {
                            (0, 0)
                        };
                        e.pairs[p][2 * k] = a;
                        e.pairs[p][2 * k + 1] = c;
                    }
                }
                g.push(e);
            }
        }
        g
    }

    /// The codes of every block of every pair of whole groups of 8 tokens, 4 at a time
    /// (`[pair][block]`, vector j: bytes 4j..4j+4 of each token's codes, token k's in i32 lane
    /// k; a last group without a pair has zeros in lanes 8..16).
    pub(super) fn group_quads(y: &[BlockQ8K], nb: usize, nt: usize) -> Vec<[__m512i; 64]> {
        let groups = nt / 8;
        let mut q = Vec::with_capacity(groups.div_ceil(2) * nb);
        for t0 in (0..groups * 8).step_by(16) {
            let here = (groups * 8 - t0).min(16);
            for b in 0..nb {
                let mut lanes = [[0i32; 16]; 64];
                for k in 0..here {
                    let qs = &y[(t0 + k) * nb + b].qs;
                    for (j, l) in lanes.iter_mut().enumerate() {
                        let c = &qs[4 * j..4 * j + 4];
                        l[k] = i32::from_le_bytes([c[0] as u8, c[1] as u8, c[2] as u8, c[3] as u8]);
                    }
                }
                // SAFETY: [i32; 16] and __m512i are both 64 bytes of plain integers; every bit
                // pattern is a valid value of either (no instruction is run: this needs no CPU
                // feature).
                q.push(lanes.map(|l| unsafe { std::mem::transmute::<[i32; 16], __m512i>(l) }));
            }
        }
        q
    }

    /// See [`super::tiled_rows_k_packed`]; `sums` is [`group_sums`] of `y`. The caller checked
    /// avx2 and fma.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn tiled_rows(
        ty: GgmlType,
        w: &[u8],
        rb: usize,
        y: &[BlockQ8K],
        sums: &[GroupSums],
        quads: &[[__m512i; 64]],
        out: &mut [f32],
        token_major: bool,
    ) {
        let rows = w.len() / rb;
        let nt = out.len() / rows;
        let bs = ty.type_size();
        let nb = rb / bs;
        let groups = nt / 8;
        assert!(
            rows * rb == w.len()
                && rows * nt == out.len()
                && y.len() >= nb * nt
                && sums.len() == groups * nb
                && (quads.is_empty() || quads.len() == groups.div_ceil(2) * nb),
            "tiled_rows: shapes"
        );
        // Where (row r, token t) goes.
        let at = |r: usize, t: usize| {
            if token_major {
                t * rows + r
            } else {
                r * nt + t
            }
        };
        let q6 = ty == GgmlType::Q6_K;
        // Every row's blocks decoded once (in place: no copy of each), then each group of 8
        // tokens block by block, all the rows against that block's activations while they
        // are in L1.
        let mut blocks = vec![RowBlock::ZERO; rows * nb];
        // (The VNNI form reads no scale vectors, unless tokens are left past the last group.)
        let vectors = quads.is_empty() || nt % 8 != 0;
        for (xb, b) in w.chunks_exact(bs).zip(blocks.iter_mut()) {
            row_block(ty, xb, b, vectors);
        }
        // Row r's sums of group g (8 tokens, lane k: token 8g + k) into `out`.
        let mut put = |g: usize, r: usize, a: __m256| {
            let mut v = [0.0f32; 8];
            // SAFETY: 8 floats into an [f32; 8].
            unsafe { _mm256_storeu_ps(v.as_mut_ptr(), a) };
            for (k, v) in v.iter().enumerate() {
                out[at(r, 8 * g + k)] = *v;
            }
        };
        if !quads.is_empty() {
            // Two groups at a time, 16 tokens in a 512-bit vector.
            let mut acc = vec![[_mm256_setzero_ps(); 2]; rows];
            for (p, gq) in quads.chunks_exact(nb).enumerate() {
                let g1 = (2 * p + 1 < groups).then_some(2 * p + 1);
                let gs = [2 * p, g1.unwrap_or(2 * p)].map(|g| &sums[g * nb..(g + 1) * nb]);
                acc.fill([_mm256_setzero_ps(); 2]);
                // SAFETY: the caller passes `quads` only where avx512f, avx512vl and
                // avx512vnni are present (`TiledSums` builds them only then).
                unsafe {
                    if q6 {
                        pair_vnni::<true>(&blocks, nb, gs, gq, &mut acc)
                    } else {
                        pair_vnni::<false>(&blocks, nb, gs, gq, &mut acc)
                    }
                };
                for (r, a) in acc.iter().enumerate() {
                    put(2 * p, r, a[0]);
                    if let Some(g1) = g1 {
                        put(g1, r, a[1]);
                    }
                }
            }
        } else {
            let mut acc = vec![_mm256_setzero_ps(); rows];
            for g in 0..groups {
                let gs = &sums[g * nb..(g + 1) * nb];
                acc.fill(_mm256_setzero_ps());
                for (b, gb) in gs.iter().enumerate() {
                    let ys: [&[i8; QK_K]; 8] = std::array::from_fn(|k| &y[(8 * g + k) * nb + b].qs);
                    for (a, rbk) in acc.iter_mut().zip(blocks[b..].iter().step_by(nb)) {
                        *a = block8(q6, rbk, ys, gb, *a);
                    }
                }
                for (r, a) in acc.iter().enumerate() {
                    put(g, r, *a);
                }
            }
        }
        // The tokens past the last whole group, one at a time.
        for (r, rbs) in blocks.chunks_exact(nb).enumerate() {
            for t in groups * 8..nt {
                let mut acc = 0.0f32;
                for (rbk, yb) in rbs.iter().zip(&y[t * nb..(t + 1) * nb]) {
                    let lanes = dot8(&rbk.codes, &rbk.scales, &yb.qs);
                    acc = if q6 {
                        let s1 = hsum_i32(_mm256_sub_epi32(lanes, q6k_bias(yb, rbk.ms)));
                        fma(rbk.d * s1 as f32, yb.d, acc)
                    } else {
                        let s1 = hsum_i32(lanes);
                        let s2 = hsum_i32x4(k4_min_products_v(rbk.ms, yb));
                        fma(fma(-rbk.dmin, s2 as f32, rbk.d * s1 as f32), yb.d, acc)
                    };
                }
                out[at(r, t)] = acc;
            }
        }
    }

    /// Two groups of 8 tokens of [`tiled_rows`] by `vpdpbusd` (`gs`: their sums; `gq`: their
    /// codes, block by block): each block, the rows 8 at a time ([`rows_vnni`]) into their
    /// float accumulators `acc` (one vector a group). The caller checked avx512f, avx512vl and
    /// avx512vnni.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
    fn pair_vnni<const Q6: bool>(
        blocks: &[RowBlock],
        nb: usize,
        gs: [&[GroupSums]; 2],
        gq: &[[__m512i; 64]],
        acc: &mut [[__m256; 2]],
    ) {
        for (b, qb) in gq.iter().enumerate() {
            let g = [&gs[0][b], &gs[1][b]];
            let row = |r: usize| &blocks[r * nb + b];
            let (a8, rest) = acc.as_chunks_mut::<8>();
            let r8 = a8.len() * 8;
            for (i, a) in a8.iter_mut().enumerate() {
                rows_vnni::<8, Q6>(std::array::from_fn(|k| row(8 * i + k)), qb, g, a);
            }
            for (i, a) in rest.iter_mut().enumerate() {
                rows_vnni::<1, Q6>([row(r8 + i)], qb, g, std::array::from_mut(a));
            }
        }
    }

    /// One block of `R` rows against two groups of 8 tokens (`q`: their codes 4 at a time,
    /// [`group_quads`]; `g`: their [`GroupSums`]), each token's in its own lane: each
    /// sub-block's raw sums by `vpdpbusd` (a row's 4 codes, unsigned, against the tokens' 4
    /// codes, signed, summed into i32: exact), times the sub-block's scale into `s1` (exact),
    /// then, for each group's half, [`finish8`] and the float accumulation of [`block8`]. `s1`
    /// is the same integer as [`block8`]'s, so the bits are the same.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
    fn rows_vnni<const R: usize, const Q6: bool>(
        rbs: [&RowBlock; R],
        q: &[__m512i; 64],
        g: [&GroupSums; 2],
        acc: &mut [[__m256; 2]; R],
    ) {
        // Sub-blocks of 16 (Q6_K) or 32 codes: 4 or 8 quads each.
        let (nsub, per) = if Q6 { (16, 4) } else { (8, 8) };
        let codes: [&[u8; QK_K]; R] = std::array::from_fn(|r| {
            // SAFETY: [__m256i; 8] is 256 bytes, any bit pattern a valid u8, alignment 32 >= 1.
            unsafe { &*(rbs[r].codes.as_ptr() as *const [u8; QK_K]) }
        });
        let mut s1 = [_mm512_setzero_si512(); R];
        for s in 0..nsub {
            let mut raw = [_mm512_setzero_si512(); R];
            for (j, qj) in q.iter().enumerate().skip(s * per).take(per) {
                for (w, c) in raw.iter_mut().zip(codes) {
                    let four =
                        i32::from_le_bytes([c[4 * j], c[4 * j + 1], c[4 * j + 2], c[4 * j + 3]]);
                    *w = _mm512_dpbusd_epi32(*w, _mm512_set1_epi32(four), *qj);
                }
            }
            for ((a, w), rbk) in s1.iter_mut().zip(raw).zip(rbs) {
                *a = _mm512_add_epi32(*a, _mm512_mullo_epi32(w, _mm512_set1_epi32(rbk.sc[s])));
            }
        }
        for h in 0..2 {
            // SAFETY: 8 floats.
            let yd = unsafe { _mm256_loadu_ps(g[h].yd.as_ptr()) };
            for ((a, s1), rbk) in acc.iter_mut().zip(s1).zip(rbs) {
                let half = if h == 0 {
                    _mm512_castsi512_si256(s1)
                } else {
                    _mm512_extracti64x4_epi64::<1>(s1)
                };
                a[h] = _mm256_fmadd_ps(finish8(Q6, rbk, half, g[h]), yd, a[h]);
            }
        }
    }

    /// The float result of one block for 8 tokens from its exact `s1` (before Q6_K's bias): `s2`
    /// (Q4_K, Q5_K) or the bias (Q6_K) by `madd` of the block's pairs against the tokens' sums,
    /// then `fma(-dmin, s2, d s1)` (Q6_K: `d (s1 - bias)`), each token's in its own lane.
    #[target_feature(enable = "avx2,fma")]
    fn finish8(q6: bool, rbk: &RowBlock, s1: __m256i, g: &GroupSums) -> __m256 {
        let pv = |p: usize| {
            // SAFETY: 16 i16, 32 bytes.
            let v = unsafe { _mm256_loadu_si256(g.pairs[p].as_ptr() as *const __m256i) };
            _mm256_madd_epi16(_mm256_set1_epi32(rbk.pairs[p]), v)
        };
        let d = _mm256_set1_ps(rbk.d);
        if q6 {
            // 32 Σ sc[s] bsums[s]: what the unbiased codes' sums exceed (q - 32)'s by.
            let bias = _mm256_add_epi32(
                _mm256_add_epi32(
                    _mm256_add_epi32(pv(0), pv(1)),
                    _mm256_add_epi32(pv(2), pv(3)),
                ),
                _mm256_add_epi32(
                    _mm256_add_epi32(pv(4), pv(5)),
                    _mm256_add_epi32(pv(6), pv(7)),
                ),
            );
            let s1 = _mm256_sub_epi32(s1, _mm256_slli_epi32::<5>(bias));
            _mm256_mul_ps(d, _mm256_cvtepi32_ps(s1))
        } else {
            let s2 = _mm256_add_epi32(
                _mm256_add_epi32(pv(0), pv(1)),
                _mm256_add_epi32(pv(2), pv(3)),
            );
            // fma(-dmin, s2, d * s1): `fnmadd` rounds -(dmin s2) + d s1 once.
            _mm256_fnmadd_ps(
                _mm256_set1_ps(rbk.dmin),
                _mm256_cvtepi32_ps(s2),
                _mm256_mul_ps(d, _mm256_cvtepi32_ps(s1)),
            )
        }
    }

    /// One block of a row against 8 tokens (`ys[k]`: token k's codes in that block, `g`: their
    /// [`GroupSums`]), token k's in lane k: `s1` as the sum of the integer products' lanes, `s2`
    /// (or Q6_K's bias) by `madd` of the block's pairs against the tokens' sums, then the tiled
    /// kernel's float steps, `fma(fma(-dmin, s2, d s1), y.d, acc)` (Q6_K: `fma(d s1, y.d, acc)`),
    /// each token's in its own lane.
    #[target_feature(enable = "avx2,fma")]
    fn block8(
        q6: bool,
        rbk: &RowBlock,
        ys: [&[i8; QK_K]; 8],
        g: &GroupSums,
        acc: __m256,
    ) -> __m256 {
        let lanes = dot8x8(&rbk.codes, &rbk.scales, ys);
        let res = finish8(q6, rbk, hsum_i32_8x8(&lanes), g);
        // SAFETY: 8 floats.
        let yd = unsafe { _mm256_loadu_ps(g.yd.as_ptr()) };
        _mm256_fmadd_ps(res, yd, acc)
    }

    /// [`dot8`] of one block's codes against 8 tokens' activations, the 32s of the block in the
    /// outer loop (each code and scale vector loaded once, the 8 tokens' lane sums in registers).
    #[target_feature(enable = "avx2")]
    fn dot8x8(codes: &[__m256i; 8], scales: &[__m256i; 8], ys: [&[i8; QK_K]; 8]) -> [__m256i; 8] {
        let mut acc = [_mm256_setzero_si256(); 8];
        for k in 0..8 {
            for (a, y) in acc.iter_mut().zip(ys) {
                // SAFETY: elements 32k..32k+32 of y.
                let yv = unsafe { _mm256_loadu_si256(y.as_ptr().add(32 * k) as *const __m256i) };
                let p = _mm256_madd_epi16(scales[k], _mm256_maddubs_epi16(codes[k], yv));
                *a = _mm256_add_epi32(*a, p);
            }
        }
        acc
    }

    /// The sums of the lanes of each of 8 vectors of i32: lane t of the result holds `v[t]`'s
    /// (exact: the callers' sums fit an i32).
    #[target_feature(enable = "avx2")]
    fn hsum_i32_8x8(v: &[__m256i; 8]) -> __m256i {
        let h01 = _mm256_hadd_epi32(v[0], v[1]);
        let h23 = _mm256_hadd_epi32(v[2], v[3]);
        let h45 = _mm256_hadd_epi32(v[4], v[5]);
        let h67 = _mm256_hadd_epi32(v[6], v[7]);
        // [v0 v1 v2 v3 over their low halves | the same over their high halves], and v4..v7.
        let g0 = _mm256_hadd_epi32(h01, h23);
        let g1 = _mm256_hadd_epi32(h45, h67);
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(g0, g1),
            _mm256_permute2x128_si256::<0x31>(g0, g1),
        )
    }

    /// See [`super::vec_dot_k_packed`]. The caller checked avx2, fma and f16c. The float steps are
    /// ggml's AVX2 kernels': `acc = fma(d, (float) lanes, acc)` in 8 lanes; Q4_K's mins in 4
    /// lanes `acc_m = fma(dmin, (float) prod, acc_m)`, Q5_K's in one `summs`; `hsum_float_8`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn vec_dot(ty: GgmlType, x: &[u8], y: &[BlockQ8K]) -> f32 {
        match ty {
            GgmlType::Q4_K => vec_dot_q4k(x, y),
            GgmlType::Q6_K => vec_dot_q6k(x, y),
            _ => vec_dot_q5k(x, y),
        }
    }

    /// [`vec_dot`] of a Q5_K row: a block's codes (fifth bits in) and scale vectors made first
    /// ([`k4_block_codes`], [`k4_scales8`]), then [`dot8`]; the mins' products summed first,
    /// then one scalar FMA (ggml's `summs`).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn vec_dot_q5k(x: &[u8], y: &[BlockQ8K]) -> f32 {
        let bs = GgmlType::Q5_K.type_size();
        let mut acc = _mm256_setzero_ps();
        let mut rest = 0.0f32;
        for (i, (xb, yb)) in x.chunks_exact(bs).zip(y).enumerate() {
            prefetch_ahead(x, i * bs + PREFETCH_AHEAD);
            let ms = k4_scales_mins_v(&xb[4..16]);
            let dmin = -yb.d * rd_f16(xb, 2);
            let prod = k4_min_products_v(ms, yb);
            rest = fma(dmin, hsum_i32x4(prod) as f32, rest);
            let lanes = dot8(&k4_block_codes(GgmlType::Q5_K, xb), &k4_scales8(ms), &yb.qs);
            let d = _mm256_set1_ps(yb.d * rd_f16(xb, 0));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc);
        }
        hsum8_ps(acc) + rest
    }

    /// How far ahead of the block being multiplied the weights are asked for, in bytes.
    const PREFETCH_AHEAD: usize = 1024;

    /// [`vec_dot`] of a Q4_K row, in the shape of ggml's AVX2 loop: each 64 of a block's codes
    /// made from one load of 32 bytes right where its two scales and two loads of activations
    /// meet them, so that the block's working set stays in the 16 vector registers (the general
    /// form builds a block's 8 code vectors and 8 scale vectors first, and spilled them). The
    /// lane sums are exact integers in any order; the float steps are [`vec_dot`]'s.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn vec_dot_q4k(x: &[u8], y: &[BlockQ8K]) -> f32 {
        const BS: usize = 144;
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for (i, (xb, yb)) in x.chunks_exact(BS).zip(y).enumerate() {
            prefetch_ahead(x, i * BS + PREFETCH_AHEAD);
            let ms = k4_scales_mins_v(&xb[4..16]);
            let dmin = -yb.d * f16c_at(xb, 2);
            let prod = k4_min_products_v(ms, yb);
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
            // The 8 scales in both 128-bit halves.
            let sc = _mm256_permute2x128_si256::<0x00>(ms, ms);
            let mut sumi = _mm256_setzero_si256();
            for j in 0..4 {
                // SAFETY: bytes 16 + 32j .. 48 + 32j of a 144-byte block (chunks_exact), and
                // elements 64j .. 64j + 64 of the 256 activations.
                let (bits, q8l, q8h) = unsafe {
                    (
                        _mm256_loadu_si256(xb.as_ptr().add(16 + 32 * j) as *const __m256i),
                        _mm256_loadu_si256(yb.qs.as_ptr().add(64 * j) as *const __m256i),
                        _mm256_loadu_si256(yb.qs.as_ptr().add(64 * j + 32) as *const __m256i),
                    )
                };
                let q4l = _mm256_and_si256(bits, m4);
                let q4h = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                let pl = _mm256_madd_epi16(bcast16(sc, 2 * j), _mm256_maddubs_epi16(q4l, q8l));
                let ph = _mm256_madd_epi16(bcast16(sc, 2 * j + 1), _mm256_maddubs_epi16(q4h, q8h));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
            }
            let d = _mm256_set1_ps(yb.d * f16c_at(xb, 0));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        let mut m = [0.0f32; 4];
        // SAFETY: 16 bytes into an [f32; 4].
        unsafe { _mm_storeu_ps(m.as_mut_ptr(), acc_m) };
        hsum8_ps(acc) + ((m[0] + m[2]) + (m[1] + m[3]))
    }

    /// The f16 at bytes `off`, `off + 1` of `b` as f32, by the CPU's conversion (exact, as the
    /// table [`rd_f16`] reads, which is 256 KB that one token's dots would pull through the
    /// caches beside the weights).
    #[target_feature(enable = "f16c")]
    fn f16c_at(b: &[u8], off: usize) -> f32 {
        let h = u16::from_le_bytes([b[off], b[off + 1]]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
    }

    /// Q6_K scale `e` (of the 16 bytes `s8`) in the low 8 i16 elements and scale `e + 1` in the
    /// high 8: the multipliers of one 32 of codes (ggml's `get_scale_shuffle`).
    #[target_feature(enable = "avx2")]
    fn q6k_scale_pair(s8: __m128i, e: usize) -> __m256i {
        let (lo, hi) = (e as u8, e as u8 + 1);
        let pat = _mm_set_epi64x(i64::from_ne_bytes([hi; 8]), i64::from_ne_bytes([lo; 8]));
        _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s8, pat))
    }

    /// [`vec_dot`] of a Q6_K row, in the shape of ggml's AVX2 loop: each 128 of a block's codes
    /// made from two loads of the low bits and one of the high bits where their scales and
    /// activations meet them (see [`vec_dot_q4k`]); the codes unbiased, the bias taken off
    /// through the sums of 16 ([`q6k_bias`]). Exact lane sums; [`vec_dot`]'s float steps.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn vec_dot_q6k(x: &[u8], y: &[BlockQ8K]) -> f32 {
        const BS: usize = 210;
        let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
        let mut acc = _mm256_setzero_ps();
        for (i, (xb, yb)) in x.chunks_exact(BS).zip(y).enumerate() {
            prefetch_ahead(x, i * BS + PREFETCH_AHEAD);
            // SAFETY: bytes 192..208 of a 210-byte block (chunks_exact).
            let s8 = unsafe { _mm_loadu_si128(xb.as_ptr().add(192) as *const __m128i) };
            let all = _mm256_cvtepi8_epi16(s8);
            let sub = q6k_bias(yb, all);
            let mut sumi = _mm256_setzero_si256();
            for n in 0..2 {
                // SAFETY: ql bytes 64n..64n+64 and qh bytes 128+32n..+32 of the block, and
                // elements 128n .. 128n + 128 of the 256 activations.
                let (ql0, ql1, qh, y0, y1, y2, y3) = unsafe {
                    let q8 = yb.qs.as_ptr().add(128 * n);
                    (
                        _mm256_loadu_si256(xb.as_ptr().add(64 * n) as *const __m256i),
                        _mm256_loadu_si256(xb.as_ptr().add(64 * n + 32) as *const __m256i),
                        _mm256_loadu_si256(xb.as_ptr().add(128 + 32 * n) as *const __m256i),
                        _mm256_loadu_si256(q8 as *const __m256i),
                        _mm256_loadu_si256(q8.add(32) as *const __m256i),
                        _mm256_loadu_si256(q8.add(64) as *const __m256i),
                        _mm256_loadu_si256(q8.add(96) as *const __m256i),
                    )
                };
                // The four 32s of this half in element order (as [`q6k_codes_v`]).
                let c0 = _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m30),
                );
                let c1 = _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m30),
                );
                let c2 = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                    _mm256_and_si256(qh, m30),
                );
                let c3 = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
                );
                let e = 8 * n;
                let p0 = _mm256_madd_epi16(q6k_scale_pair(s8, e), _mm256_maddubs_epi16(c0, y0));
                let p1 = _mm256_madd_epi16(q6k_scale_pair(s8, e + 2), _mm256_maddubs_epi16(c1, y1));
                let p2 = _mm256_madd_epi16(q6k_scale_pair(s8, e + 4), _mm256_maddubs_epi16(c2, y2));
                let p3 = _mm256_madd_epi16(q6k_scale_pair(s8, e + 6), _mm256_maddubs_epi16(c3, y3));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p2, p3));
            }
            let d = _mm256_set1_ps(yb.d * f16c_at(xb, 208));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi, sub)), acc);
        }
        hsum8_ps(acc)
    }

    /// A hint that the bytes at `off` from the start of `x` (past its end: the next rows, which
    /// follow in memory) will be read soon; no effect on results.
    #[inline(always)]
    fn prefetch_ahead(x: &[u8], off: usize) {
        let p = x.as_ptr().wrapping_add(off) as *const i8;
        // SAFETY: a prefetch is only a hint: it reads nothing architecturally and cannot fault,
        // whatever the address (`wrapping_add` makes no claim that it is in bounds).
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(128));
        }
    }

    /// [`hsum8`] of the lanes of `v`.
    #[target_feature(enable = "avx2")]
    fn hsum8_ps(v: __m256) -> f32 {
        let mut a = [0.0f32; 8];
        // SAFETY: 32 bytes into an [f32; 8].
        unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) };
        hsum8(&a)
    }
}
