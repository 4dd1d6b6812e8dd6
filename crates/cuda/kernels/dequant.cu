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
