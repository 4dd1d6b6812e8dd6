//! Scalar models of the AVX2 idioms ggml-cpu uses, lane by lane: the horizontal sums, ggml's
//! vectorised `expf` and `silu`, and the f16 / bf16 conversions.
//!
//! Each function states the intrinsic sequence it reproduces. Addition order inside a horizontal
//! sum is part of the result, so the two reductions ggml uses (`hsum_float_8` and
//! `GGML_F32x8_REDUCE`) are kept apart.

use half::f16;

/// `hsum_float_8` (arch/x86/quants.c:43) and tinyBLAS's `hsum(__m256)` (llamafile/sgemm.cpp:277):
/// `hi + lo`, then `movehl`, then `movehdup`: `((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))`.
#[inline(always)]
pub fn hsum8(v: &[f32; 8]) -> f32 {
    let t = [v[4] + v[0], v[5] + v[1], v[6] + v[2], v[7] + v[3]];
    let u0 = t[0] + t[2];
    let u1 = t[1] + t[3];
    u0 + u1
}

/// `GGML_F32x8_REDUCE` (simd-mappings.h:602) over `GGML_F32_ARR = 4` accumulators:
/// `x0+=x2, x1+=x3, x0+=x1` lane-wise, then `lo + hi`, then two `hadd`s:
/// `((t0+t1)+(t2+t3))` with `t_i = x0[i] + x0[i+4]`.
#[inline(always)]
pub fn reduce4x8(x: &[[f32; 8]; 4]) -> f32 {
    let mut a = [0.0f32; 8];
    for i in 0..8 {
        let x0 = x[0][i] + x[2][i];
        let x1 = x[1][i] + x[3][i];
        a[i] = x0 + x1;
    }
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (t[0] + t[1]) + (t[2] + t[3])
}

/// `_mm256_fmadd_ps(a, b, c)` on one lane: `a * b + c` rounded once.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

// ggml_v_expf constants (vec.h:1234), as bit patterns of the hex-float literals
const EXP_R: u32 = 0x4b40_0000; // 0x1.8p23f
const EXP_LOG2E: u32 = 0x3fb8_aa3b; // 0x1.715476p+0f
const EXP_LN2_LO: u32 = 0x35bf_be8e; // 0x1.7f7d1cp-20f
const EXP_LN2_HI: u32 = 0x3f31_7200; // 0x1.62e4p-1f
const EXP_P0: u32 = 0x3c07_2010; // 0x1.0e4020p-7f
const EXP_P1: u32 = 0x3d2b_9f17; // 0x1.573e2ep-5f
const EXP_P2: u32 = 0x3e2a_af33; // 0x1.555e66p-3f
const EXP_P3: u32 = 0x3eff_fedb; // 0x1.fffdb6p-2f
const EXP_P4: u32 = 0x3f7f_fff6; // 0x1.ffffecp-1f

#[inline(always)]
fn c(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// One lane of `ggml_v_expf(__m256)` (vec.h:1234, the AVX2+FMA variant adapted from ARM's
/// optimized routines): not libm's `expf`; max error 1.45 ulp + 0.5.
#[inline(always)]
pub fn v_expf(x: f32) -> f32 {
    let r = c(EXP_R);
    let z = fma(x, c(EXP_LOG2E), r);
    let n = z - r;
    // _mm256_fnmadd_ps(a, b, c) = -(a*b) + c, one rounding
    let b = fma(-n, c(EXP_LN2_LO), fma(-n, c(EXP_LN2_HI), x));
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
    let cmask = n.abs() > 126.0;
    let u = b * b;
    let j = fma(
        fma(
            fma(c(EXP_P0), b, c(EXP_P1)),
            u,
            fma(c(EXP_P2), b, c(EXP_P3)),
        ),
        u,
        c(EXP_P4) * b,
    );
    if !cmask {
        return fma(j, k, k);
    }
    // _CMP_LE_OQ: false for NaN
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        fma(s2, j, s2) * s1
    }
}

/// `ggml_v_expf(__m256)` (vec.h:1234) itself, eight lanes at once: each lane's bits are
/// [`v_expf`]'s.
///
/// # Safety
/// The CPU must have avx2 and fma.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub fn v_expf8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let k1 = |b: u32| _mm256_set1_ps(c(b));
    let r = k1(EXP_R);
    let z = _mm256_fmadd_ps(x, k1(EXP_LOG2E), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(n, k1(EXP_LN2_LO), _mm256_fnmadd_ps(n, k1(EXP_LN2_HI), x));
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(
        e,
        _mm256_castps_si256(_mm256_set1_ps(1.0)),
    ));
    let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let cm = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(126.0));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(k1(EXP_P0), b, k1(EXP_P1)),
            u,
            _mm256_fmadd_ps(k1(EXP_P2), b, k1(EXP_P3)),
        ),
        u,
        _mm256_mul_ps(k1(EXP_P4), b),
    );
    if _mm256_movemask_ps(cm) == 0 {
        return _mm256_fmadd_ps(j, k, k);
    }
    let g = _mm256_and_si256(
        _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
        _mm256_set1_epi32(0x8200_0000u32 as i32),
    );
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    let d = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
    _mm256_or_ps(
        _mm256_and_ps(d, _mm256_mul_ps(s1, s1)),
        _mm256_andnot_ps(
            d,
            _mm256_or_ps(
                _mm256_and_ps(cm, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                _mm256_andnot_ps(cm, _mm256_fmadd_ps(k, j, k)),
            ),
        ),
    )
}

/// One lane of `ggml_v_silu(__m256)` (vec.h:1274): `x / (1 + v_expf(0 - x))`.
#[inline(always)]
pub fn v_silu(x: f32) -> f32 {
    let neg_x = 0.0f32 - x;
    x / (1.0f32 + v_expf(neg_x))
}

/// `ggml_silu_f32` (vec.h:1065), the scalar tail of the vectorised loops: libm `expf`.
#[inline(always)]
pub fn silu_scalar(x: f32) -> f32 {
    x / (1.0f32 + (-x).exp())
}

/// `GGML_CPU_FP32_TO_FP16`: F16C `vcvtps2ph` with rounding mode 0 (nearest even).
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// f16 -> f32 (exact), through a 64K-entry table built once.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    f16_table()[h as usize]
}

fn f16_table() -> &'static [f32; 65536] {
    static TABLE: std::sync::OnceLock<Box<[f32; 65536]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = Box::new([0.0f32; 65536]);
        for (i, v) in t.iter_mut().enumerate() {
            *v = f16::from_bits(i as u16).to_f32();
        }
        t
    })
}

/// `ggml_compute_fp32_to_bf16` (ggml-impl.h:623): round to nearest even, NaN forced quiet.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

#[inline(always)]
pub fn rd_f16(b: &[u8], off: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

#[inline(always)]
pub fn rd_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

#[inline(always)]
pub fn rd_f32(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// The f16 -> f32 table, for kernels that convert many values (fetch it once per call).
#[inline(always)]
pub fn f16_lut() -> &'static [f32; 65536] {
    f16_table()
}

/// Whether this CPU has AVX2, FMA and F16C (the anchor's ISA).
pub fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn run_avx2_fma<R, F: FnOnce() -> R>(f: F) -> R {
    f()
}

/// Run `f` compiled for AVX2 + FMA + F16C when the CPU has them, else as is. Speed only: `mul_add`
/// is fused in both (a `vfmadd` instruction or a libm `fmaf` call), so the bits are the same. The
/// kernels are `#[inline(always)]` so that they are compiled inside the fast copy.
#[inline(always)]
pub fn with_avx2_fma<R, F: FnOnce() -> R>(f: F) -> R {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: `run_avx2_fma` only requires the avx2, fma and f16c target features, and the CPU
        // has all three (checked at runtime by `has_avx2_fma` just above).
        return unsafe { run_avx2_fma(f) };
    }
    f()
}
