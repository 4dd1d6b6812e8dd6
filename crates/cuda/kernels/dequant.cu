// Exact dequantization of one weight element, as formats.rs (and gguf-py's numpy): every
// product rounded before the next operation (__fmul_rn / __fsub_rn are never contracted).
// `nbt` is the matrix's total block count (the offset of the SoA arrays), `blk` the block,
// `i` the element within it.

__device__ __forceinline__ float dq_elem(const u8* w, int fmt, long long nbt, long long blk, int i) {
    switch (fmt) {
    case FMT_F32: return ((const float*)w)[blk];
    case FMT_F16: return h2f(((const u16*)w)[blk]);
    case FMT_BF16: return bf2f(((const u16*)w)[blk]);
    case FMT_Q8_0: {
        float d = h2f(((const u16*)(w + nbt * 32))[blk]);
        return __fmul_rn((float)(signed char)w[blk * 32 + i], d);
    }
    case FMT_Q4_0: {
        float d = h2f(((const u16*)(w + nbt * 16))[blk]);
        u8 q = w[blk * 16 + (i & 15)];
        int n = i < 16 ? (q & 15) : (q >> 4);
        return __fmul_rn(d, (float)(n - 8));
    }
    case FMT_Q4_K: {
        const u8* b = w + blk * 144;
        float d = h2f(*(const u16*)b), dmin = h2f(*(const u16*)(b + 2));
        int j = i >> 6, within = i & 63, hi = within >= 32, l = within & 31;
        int sc, m;
        scale_min_k4(2 * j + hi, b + 4, &sc, &m);
        u8 q = b[16 + 32 * j + l];
        int n = hi ? (q >> 4) : (q & 15);
        return __fsub_rn(__fmul_rn(__fmul_rn(d, (float)sc), (float)n), __fmul_rn(dmin, (float)m));
    }
    case FMT_Q5_K: {
        const u8* b = w + blk * 176;
        float d = h2f(*(const u16*)b), dmin = h2f(*(const u16*)(b + 2));
        int j = i >> 6, within = i & 63, hi = within >= 32, l = within & 31;
        int sc, m;
        scale_min_k4(2 * j + hi, b + 4, &sc, &m);
        u8 q = b[48 + 32 * j + l];
        u8 h = b[16 + l];
        int u = hi ? (2 << (2 * j)) : (1 << (2 * j));
        int n = (hi ? (q >> 4) : (q & 15)) + ((h & u) ? 16 : 0);
        return __fsub_rn(__fmul_rn(__fmul_rn(d, (float)sc), (float)n), __fmul_rn(dmin, (float)m));
    }
    case FMT_Q6_K: {
        const u8* ql = w + blk * 128;
        const u8* qh = w + nbt * 128 + blk * 64;
        const signed char* sc = (const signed char*)(w + nbt * 192 + blk * 16);
        float d = h2f(((const u16*)(w + nbt * 208))[blk]);
        int n = i >> 7, r = i & 127, l = r & 31, qt = r >> 5;
        u8 lo = ql[64 * n + l + ((qt & 1) ? 32 : 0)];
        int nib = (qt >= 2) ? (lo >> 4) : (lo & 15);
        int h = (qh[32 * n + l] >> (2 * qt)) & 3;
        int q = (nib | (h << 4)) - 32;
        return __fmul_rn(__fmul_rn(d, (float)sc[8 * n + (l >> 4) + 2 * qt]), (float)q);
    }
    }
    return 0.0f;
}

__device__ __forceinline__ int fmt_block(int fmt) {
    return fmt <= FMT_BF16 ? 1 : (fmt <= FMT_Q4_0 ? 32 : 256);
}

// out[r][c] = W[row0 + r][c] for r < nrows (row-major f32).
extern "C" __global__ void dequant_rows(const u8* w, int fmt, long long nbt, int cols, long long row0, int nrows, float* out) {
    long long n = (long long)nrows * cols;
    int bs = fmt_block(fmt);
    long long bpr = cols / bs;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
        long long r = e / cols;
        int c = (int)(e - r * cols);
        long long blk = (row0 + r) * bpr + c / bs;
        out[e] = dq_elem(w, fmt, nbt, blk, c % bs);
    }
}

// Token embeddings: out[i] = row tokens[i] of the table (the token ids live on the device).
extern "C" __global__ void get_rows(const u8* w, int fmt, long long nbt, int cols, const u32* tokens, float* out) {
    int t = blockIdx.y;
    long long row = tokens[t];
    int bs = fmt_block(fmt);
    long long bpr = cols / bs;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
        out[(long long)t * cols + c] = dq_elem(w, fmt, nbt, row * bpr + c / bs, c % bs);
    }
}

// ==== Products of many tokens on the f16 tensor cores (cuBLAS GemmEx), for prompts ====
//
// A weight w (dequantized exactly, dq_elem's arithmetic) and an activation x are carried in f16
// after a power-of-two scale each: v = w 2^A with A from the matrix's largest |w| (`w16_max`,
// once per matrix), u = x 2^B_t with B_t from token t's largest |x| (`x16_rowmax`: per token,
// because the sandwich post-norm rescales each token's output, so each token needs its own
// relative precision; a scale shared by the micro-batch lost the small tokens' digits to f16
// subnormals, 1.4e-2 on the "mid" synthetic model, gpu.rs, H200, 2026-11-30), both so that the
// largest value is below 2^14: no f16 overflows, and everything within 2^-28 of the largest
// value is a normal f16. hi = f16(v); with the split, also lo = f16((v - hi) 2^11) (v - hi is
// exact in f32): hi + lo 2^-11 holds v to about 2^-22 of itself. Products (f32 accumulation on
// the tensor cores, times alpha = 2^-A in cuBLAS, then times 2^-B_t per token, `y16_unscale`;
// powers of two):
// - fast: hi.hi, each factor to 2^-12 of itself;
// - split: hi.hi + 2^-11 (hi.lo + lo.hi), each term to about 2^-21 of itself (lo.lo left out:
//   below 2^-22).
// The scales never change a value's bits beyond those roundings (powers of two; A is clamped to
// 2^+-60 so that alpha stays a normal f32, B_t to 2^+-120; a matrix whose largest weight is
// below 2^-46 or above 2^74 loses its smallest values to f16's subnormals or overflows as f32
// would).

// w16_up, x16_up, x16_down (common.cuh): the powers of two of the section above.

// Largest |w| of a matrix into *out (f32 bits: non-negative floats order as their bits; a NaN's
// bits, sign cleared, lie above Inf's). Grid-stride over rows, threads over columns; *out must
// start at 0.
extern "C" __global__ void w16_max(const u8* w, int fmt, long long nbt, int cols, long long rows, u32* out) {
    const int bs = fmt_block(fmt);
    const long long bpr = cols / bs;
    u32 m = 0;
    for (long long r = blockIdx.x; r < rows; r += gridDim.x)
        for (int c = threadIdx.x; c < cols; c += blockDim.x)
            m = max(m, __float_as_uint(dq_elem(w, fmt, nbt, r * bpr + c / bs, c % bs)) & 0x7fffffffu);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) atomicMax(out, m);
}

// A matrix's product factors from its largest |w| (w16_max, already run): alpha[0] = 2^-A
// (hi.hi), alpha[1] = 2^-(A+11) (the lo terms), alpha[2] = 0 and alpha[3] = 1 (cuBLAS's beta:
// write, add). One thread, once per matrix at upload.
extern "C" __global__ void w16_alpha(const u32* wmax, float* alpha) {
    const int A = f16_shift(*wmax, 60);
    alpha[0] = ldexpf(1.0f, -A);
    alpha[1] = ldexpf(1.0f, -(A + 11));
    alpha[2] = 0.0f;
    alpha[3] = 1.0f;
}

// Eight consecutive weights c0 .. c0 + 7 (c0 a multiple of 8) of row `row`, exactly as dq_elem
// gives them; Q4_K and Q6_K decode their run's scale once.
__device__ __forceinline__ void dq8(const u8* w, int fmt, long long nbt, long long bpr, long long row, int c0, float (&v)[8]) {
    const int bs = fmt_block(fmt);
    const long long blk = row * bpr + c0 / bs;
    const int i0 = c0 % bs;
    if (fmt == FMT_Q4_K) {
        const u8* b = w + blk * 144;
        const float d = h2f(*(const u16*)b), dmin = h2f(*(const u16*)(b + 2));
        const int j = i0 >> 6, hi = (i0 & 63) >= 32, l0 = i0 & 31;
        int sc, m;
        scale_min_k4(2 * j + hi, b + 4, &sc, &m);
        const float ds = __fmul_rn(d, (float)sc), dm = __fmul_rn(dmin, (float)m);
        const uint2 q = *(const uint2*)(b + 16 + 32 * j + l0);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const u32 byte = ((k < 4 ? q.x : q.y) >> (8 * (k & 3))) & 0xFFu;
            const int n = hi ? (int)(byte >> 4) : (int)(byte & 15);
            v[k] = __fsub_rn(__fmul_rn(ds, (float)n), dm);
        }
    } else if (fmt == FMT_Q6_K) {
        const int n = i0 >> 7, r = i0 & 127, l0 = r & 31, qt = r >> 5;
        const uint2 lo = *(const uint2*)(w + blk * 128 + 64 * n + l0 + ((qt & 1) ? 32 : 0));
        const uint2 qh = *(const uint2*)(w + nbt * 128 + blk * 64 + 32 * n + l0);
        const float d = h2f(((const u16*)(w + nbt * 208))[blk]);
        const float ds = __fmul_rn(d, (float)((const signed char*)(w + nbt * 192 + blk * 16))[8 * n + (l0 >> 4) + 2 * qt]);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const u32 lb = ((k < 4 ? lo.x : lo.y) >> (8 * (k & 3))) & 0xFFu;
            const u32 hb = ((k < 4 ? qh.x : qh.y) >> (8 * (k & 3))) & 0xFFu;
            const int nib = (qt >= 2) ? (int)(lb >> 4) : (int)(lb & 15);
            const int q = (nib | (int)(((hb >> (2 * qt)) & 3) << 4)) - 32;
            v[k] = __fmul_rn(ds, (float)q);
        }
    } else {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = dq_elem(w, fmt, nbt, blk + (i0 + k) / bs, (i0 + k) % bs);
    }
}

// hi (and lo, when not null) of eight values v 2^S into 16-byte stores at p[0..7].
__device__ __forceinline__ void put16(const float (&v)[8], float up, u16* hi, u16* lo) {
    u32 h[4], l[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float a = v[2 * k] * up, b = v[2 * k + 1] * up;
        const u16 ha = f2h(a), hb = f2h(b);
        h[k] = (u32)ha | ((u32)hb << 16);
        l[k] = (u32)f2h((a - h2f(ha)) * 2048.0f) | ((u32)f2h((b - h2f(hb)) * 2048.0f) << 16);
    }
    *(uint4*)hi = make_uint4(h[0], h[1], h[2], h[3]);
    if (lo) *(uint4*)lo = make_uint4(l[0], l[1], l[2], l[3]);
}

// Rows row0 .. row0 + nrows - 1 of W into the f16 slab: hi[r ld + c] (and lo[r ld + c]) for
// slab row r. grid (cols / 8 / blockDim.x rounded up, up to 65535 row steps).
extern "C" __global__ void w16_rows(const u8* w, int fmt, long long nbt, int cols, long long row0, int nrows,
                                    const u32* wmax, u16* hi, u16* lo, long long ld) {
    const float up = w16_up(wmax);
    const int c0 = 8 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (c0 >= cols) return;
    const long long bpr = cols / fmt_block(fmt);
    for (int r = blockIdx.y; r < nrows; r += gridDim.y) {
        float v[8];
        dq8(w, fmt, nbt, bpr, row0 + r, c0, v);
        put16(v, up, hi + (long long)r * ld + c0, lo ? lo + (long long)r * ld + c0 : (u16*)0);
    }
}

// Each token's largest |x| (rows x cols f32, cols a multiple of 4) into out[t] (f32 bits, as
// w16_max). One block of 256 threads per token.
// The largest |x| of a row of cols floats (a multiple of 4, 16-byte aligned) as f32 bits, in
// every thread of the block (up to 1024 threads, a multiple of 32). A maximum does not depend
// on the order it is taken in.
__device__ __forceinline__ u32 block_row_absmax(const float* __restrict__ xr, int cols) {
    __shared__ u32 wm[32];
    u32 m = 0;
    for (int c = 4 * threadIdx.x; c < cols; c += 4 * blockDim.x) {
        const float4 a = *(const float4*)(xr + c);
        m = max(m, max(max(__float_as_uint(a.x) & 0x7fffffffu, __float_as_uint(a.y) & 0x7fffffffu),
                       max(__float_as_uint(a.z) & 0x7fffffffu, __float_as_uint(a.w) & 0x7fffffffu)));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) wm[threadIdx.x >> 5] = m;
    __syncthreads();
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) m = max(m, wm[i]);
    return m;
}

extern "C" __global__ void __launch_bounds__(256) x16_rowmax(const float* __restrict__ x, int cols, u32* out) {
    const u32 m = block_row_absmax(x + (long long)blockIdx.x * cols, cols);
    if (threadIdx.x == 0) out[blockIdx.x] = m;
}

// Eight floats at p (16-byte aligned) into v.
__device__ __forceinline__ void ld8(const float* p, float (&v)[8]) {
    const float4 a = *(const float4*)p;
    const float4 b = *(const float4*)(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// The micro-batch's activations (rows x cols f32) into hi[t ld + c] (and lo), token t scaled by
// 2^B_t. They do not depend on the matrix: one conversion serves every product of the same x.
extern "C" __global__ void x16_split(const float* __restrict__ x, int rows, int cols, const u32* xmax,
                                     u16* hi, u16* lo, long long ld) {
    const int c0 = 8 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (c0 >= cols) return;
    for (int t = blockIdx.y; t < rows; t += gridDim.y) {
        const float up = x16_up(xmax[t]);
        float v[8];
        ld8(x + (long long)t * cols + c0, v);
        put16(v, up, hi + (long long)t * ld + c0, lo ? lo + (long long)t * ld + c0 : (u16*)0);
    }
}

// y[t][r] *= 2^-B_t (rows tokens of width floats): the activations' per-token scale undone.
extern "C" __global__ void y16_unscale(float* y, int rows, int width, const u32* xmax) {
    for (int t = blockIdx.y; t < rows; t += gridDim.y) {
        const float down = x16_down(xmax[t]);
        float* yr = y + (long long)t * width;
        for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < width; r += gridDim.x * blockDim.x) yr[r] *= down;
    }
}


// ==== Products of many tokens on the FP8 tensor cores (cuBLASLt), `--fp8-weights` ====
//
// `--mode fast --fp8-weights` keeps each matrix in e4m3 (1 byte per weight) and multiplies it by
// e4m3 activations, f32 accumulation, on Hopper's FP8 tensor cores (cuBLASLt: twice the f16
// rate, half the f16 copy's bytes). A weight w (dequantized exactly, dq8) and an activation x go
// in after a power-of-two scale each: v = w 2^S_r from its row's largest |w| (`w8_rowscale`)
// and u = x 2^S_t from its token's largest |x| (x16_rowmax), both so that the largest value
// lies in [2^7, 2^8): below e4m3's largest finite value (448), so nothing saturates, and
// everything within 2^-13 of the largest value is a normal e4m3 (smallest normal 2^-6). e4m3
// keeps 3 bits after the leading one: each operand is rounded to nearest (ties to even) to
// within 2^-4 of itself (normals; subnormals to within 2^-10 absolute before the scale is
// undone). The products sum in f32 on the tensor cores; 2^-S_r and 2^-S_t (`down`, one vector
// each) are applied by cuBLASLt's outer-vector scales, or after it (`y_scale_outer`). Powers of
// two: they change no bits. An activation or weight of +-Inf goes in as NaN (e4m3 has no
// infinity; the conversion would saturate it to 448), so that it still shows in the output.

// e4m3 (ties to even, saturating to +-448 what is finite) of v0..v3, v0 in the lowest byte.
__device__ __forceinline__ u32 e4m3x4(float v0, float v1, float v2, float v3) {
#if __CUDA_ARCH__ >= 890
    const float nan = __int_as_float(0x7fc00000);
    v0 = isinf(v0) ? nan : v0;
    v1 = isinf(v1) ? nan : v1;
    v2 = isinf(v2) ? nan : v2;
    v3 = isinf(v3) ? nan : v3;
    unsigned short lo, hi;
    // cvt ...e4m3x2.f32 d, a, b: a into the upper byte of d, b into the lower.
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(v1), "f"(v0));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(v3), "f"(v2));
    return (u32)lo | ((u32)hi << 16);
#else
    __trap();  // the host refuses --fp8-weights below compute capability 8.9
    return 0;
#endif
}

// Eight values times `up` into 8 bytes of e4m3 at p.
__device__ __forceinline__ void put8(const float (&v)[8], float up, u8* p) {
    *(uint2*)p = make_uint2(e4m3x4(v[0] * up, v[1] * up, v[2] * up, v[3] * up),
                            e4m3x4(v[4] * up, v[5] * up, v[6] * up, v[7] * up));
}

// Each row's factor down[r] = 2^-S_r from its largest |w| (S_r: pow2_shift(max, 8, 60)). Blocks
// stride over rows, threads over runs of 8 columns (cols a multiple of 8).
extern "C" __global__ void __launch_bounds__(256) w8_rowscale(const u8* w, int fmt, long long nbt, int cols, int rows,
                                                              float* down) {
    __shared__ u32 wm[8];
    const long long bpr = cols / fmt_block(fmt);
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        u32 m = 0;
        for (int c0 = 8 * threadIdx.x; c0 < cols; c0 += 8 * blockDim.x) {
            float v[8];
            dq8(w, fmt, nbt, bpr, r, c0, v);
#pragma unroll
            for (int k = 0; k < 8; k++) m = max(m, __float_as_uint(v[k]) & 0x7fffffffu);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
        if ((threadIdx.x & 31) == 0) wm[threadIdx.x >> 5] = m;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int i = 0; i < (int)(blockDim.x >> 5); i++) m = max(m, wm[i]);
            down[r] = ldexpf(1.0f, -pow2_shift(m, 8, 60));
        }
        __syncthreads();
    }
}

// Every row r of W (nrows) times 1 / down[r] (= 2^S_r, exact), into e4m3 at out[r ld + c]; grid
// as w16_rows.
extern "C" __global__ void w8_rows(const u8* w, int fmt, long long nbt, int cols, int nrows, const float* down,
                                   u8* out, long long ld) {
    const int c0 = 8 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (c0 >= cols) return;
    const long long bpr = cols / fmt_block(fmt);
    for (int r = blockIdx.y; r < nrows; r += gridDim.y) {
        float v[8];
        dq8(w, fmt, nbt, bpr, r, c0, v);
        put8(v, 1.0f / down[r], out + (long long)r * ld + c0);
    }
}

// The micro-batch's activations (rows x cols f32, cols a multiple of 8) into e4m3 at out[t ld +
// c], token t times 2^S_t (S_t: pow2_shift(xmax[t], 8, 120)), down[t] = 2^-S_t. One block per
// token (up to 1024 threads, a multiple of 32) finds the token's largest |x| (written to
// xmax[t], as x16_rowmax writes it, for the f16 products of the same call), then writes its
// e4m3 row; the second pass over the row reads it from the cache.
extern "C" __global__ void __launch_bounds__(1024) x8_rowquant(const float* __restrict__ x, int cols, u32* xmax,
                                                               u8* out, long long ld, float* down) {
    const int t = blockIdx.x;
    const float* xr = x + (long long)t * cols;
    const u32 m = block_row_absmax(xr, cols);
    const int S = pow2_shift(m, 8, 120);
    if (threadIdx.x == 0) {
        xmax[t] = m;
        down[t] = ldexpf(1.0f, -S);
    }
    const float up = ldexpf(1.0f, S);
    for (int c0 = 8 * threadIdx.x; c0 < cols; c0 += 8 * blockDim.x) {
        float v[8];
        ld8(xr + c0, v);
        put8(v, up, out + (long long)t * ld + c0);
    }
}

// A joint product's outputs apart: y holds rows tokens of width floats (the products of
// matrices stacked row-wise, `w8_joint`); output j takes columns [off_j, off_j + w_j) of each
// token into its own rows of w_j floats. Up to four outputs (w_j 0: none); every off_j and w_j a
// multiple of 4 (w8_joint_ready checks the rows).
extern "C" __global__ void y_split4(const float* __restrict__ y, int rows, int width, float* o0, int w0,
                                    float* o1, int w1, float* o2, int w2, float* o3, int w3) {
    const int c = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= width) return;
    float* o;
    int w, off;
    if (c < w0) { o = o0; w = w0; off = 0; }
    else if (c < w0 + w1) { o = o1; w = w1; off = w0; }
    else if (c < w0 + w1 + w2) { o = o2; w = w2; off = w0 + w1; }
    else { o = o3; w = w3; off = w0 + w1 + w2; }
    for (int t = blockIdx.y; t < rows; t += gridDim.y)
        *(float4*)(o + (long long)t * w + (c - off)) = *(const float4*)(y + (long long)t * width + c);
}

// y[t][r] = (y[t][r] a[r]) s[t] (rows tokens of width floats): the scales a product on the FP8
// tensor cores leaves out when cuBLASLt cannot apply them (one multiply each: powers of two).
extern "C" __global__ void y_scale_outer(float* y, int rows, int width, const float* a, const float* s) {
    for (int t = blockIdx.y; t < rows; t += gridDim.y) {
        const float k = s[t];
        float* yr = y + (long long)t * width;
        for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < width; r += gridDim.x * blockDim.x) yr[r] = (yr[r] * a[r]) * k;
    }
}
