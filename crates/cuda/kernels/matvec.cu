// Matrix-vector products for decode (a few tokens): y[t][r] = W[r] . x[t], f32 activations,
// f32 accumulation, weights dequantized exactly.
//
// Each warp computes R consecutive rows for NT tokens, so every activation value it loads
// from L1 serves R rows. Quantized codes become floats without integer-to-float conversion:
// a code q of b bits is placed in the mantissa of 1.0 (one byte permute), giving
// qf = 1 + q / 2^b exactly, and the affine terms are folded per group of 8 or 16 weights:
//   sum_i (d*q_i - m) x_i = 2^b d sum_i qf_i x_i - (2^b d + m) sum_i x_i,
// with sum_i x_i read from `xs` (sums of 8 consecutive activations, written by the producer).
// This regrouping is exact in real arithmetic; in f32 it stays within a few ulp of the direct
// sum (qf in [1, 2) keeps the two sums of similar size).

#define MV_ZERO(acc) \
    _Pragma("unroll") for (int r_ = 0; r_ < R; r_++) _Pragma("unroll") for (int t_ = 0; t_ < NT; t_++) acc[r_][t_] = 0.0f;

// The warps of a block split the row's columns; their partial sums are added in warp order.
template <int R, int NT>
__device__ __forceinline__ void mv_store(float (&acc)[R][NT], float* y, int r0, int rows, int lane) {
    __shared__ float part[4][R * NT];  // R * NT <= 64 < 128 threads
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = warp_sum(acc[r][t]);
            if (lane == 0) part[warp][r * NT + t] = v;
        }
    __syncthreads();
    const int i = threadIdx.x;
    if (i < R * NT) {
        const int r = i / NT, t = i % NT;
        float v = (part[0][i] + part[1][i]) + (part[2][i] + part[3][i]);
        if (r0 + r < rows) y[(long long)t * rows + r0 + r] = v;
    }
}

// qf = 1 + byte/2^7 for the byte k of `v` holding (0x80 | q << s): the float 0x3F80_0000 | q << (19..)
__device__ __forceinline__ float qf_byte(u32 v, int k) {
    return __uint_as_float(__byte_perm(v, 0x3F000000u, 0x7054u | ((u32)k << 8)));
}

__device__ __forceinline__ u32 byte_of3(u32 a, u32 b, u32 c, int k) {
    u32 w = k < 4 ? a : (k < 8 ? b : c);
    return (w >> (8 * (k & 3))) & 0xFFu;
}

// The 6-bit scales and mins of sub-blocks 2j and 2j+1 (j = 0..3) from the 12 scale bytes held in
// three words, without branches (get_scale_min_k4 of ggml-quants.c on four bytes at once):
// sub-blocks 0-3: sc = q[i] & 63, m = q[i+4] & 63; 4-7: sc = (q[i+4] & 15) | (q[i-4] >> 6) << 4,
// m = (q[i+4] >> 4) | (q[i] >> 6) << 4.
__device__ __forceinline__ void scale_min_pair(int j, u32 s0, u32 s1, u32 s2, float* sa, float* ma, float* sb, float* mb) {
    const u32 sc_lo = s0 & 0x3F3F3F3Fu, m_lo = s1 & 0x3F3F3F3Fu;
    const u32 sc_hi = (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u);
    const u32 m_hi = ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u);
    const u32 sc = j < 2 ? sc_lo : sc_hi, m = j < 2 ? m_lo : m_hi;
    const int sh = 16 * (j & 1);
    *sa = (float)((sc >> sh) & 0xFFu);
    *sb = (float)((sc >> (sh + 8)) & 0xFFu);
    *ma = (float)((m >> sh) & 0xFFu);
    *mb = (float)((m >> (sh + 8)) & 0xFFu);
}

// 6-bit scale/min of sub-block j from the 12 scale bytes held in three words.
__device__ __forceinline__ void scale_min_w(int j, u32 s0, u32 s1, u32 s2, float* sc, float* m) {
    int a, b;
    if (j < 4) {
        a = byte_of3(s0, s1, s2, j) & 63;
        b = byte_of3(s0, s1, s2, j + 4) & 63;
    } else {
        a = (byte_of3(s0, s1, s2, j + 4) & 0xF) | ((byte_of3(s0, s1, s2, j - 4) >> 6) << 4);
        b = (byte_of3(s0, s1, s2, j + 4) >> 4) | ((byte_of3(s0, s1, s2, j) >> 6) << 4);
    }
    *sc = (float)a;
    *m = (float)b;
}

// ---- Q4_K: 8 lanes per 256-weight block, each lane one 16-byte chunk of qs (32 weights) ----
template <int R, int NT>
__device__ __forceinline__ void mv_q4_k(const u8* __restrict__ W, const float* __restrict__ x, const float* __restrict__ xs,
                                        float* __restrict__ y, int rows, int cols) {
    const int lane = threadIdx.x & 31;
    const int r0 = blockIdx.x * R, warp = threadIdx.x >> 5;
    const int nb = cols >> 8, n8 = cols >> 3;
    const int sub = lane & 7, j = sub >> 1, half = sub & 1;
    float acc[R][NT];
    MV_ZERO(acc);
#pragma unroll 2
    for (int b = (lane >> 3) + 4 * warp; b < nb; b += 16) {
        const int e_lo = b * 256 + 64 * j + 16 * half, e_hi = e_lo + 32;
        u32 q[R][4];
        float d1[R], c1[R], d2[R], c2[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int row = min(r0 + r, rows - 1);
            const u8* blk = W + ((long long)row * nb + b) * 144;
            uint4 hd = __ldg((const uint4*)blk);
            uint4 qq = __ldg((const uint4*)(blk + 16 + 16 * sub));
            q[r][0] = qq.x; q[r][1] = qq.y; q[r][2] = qq.z; q[r][3] = qq.w;
            float d = h2f((u16)(hd.x & 0xFFFF)), dm = h2f((u16)(hd.x >> 16));
            float sa, ma, sb, mb;
            scale_min_pair(j, hd.y, hd.z, hd.w, &sa, &ma, &sb, &mb);
            d1[r] = 16.0f * (d * sa); c1[r] = d1[r] + dm * ma;
            d2[r] = 16.0f * (d * sb); c2[r] = d2[r] + dm * mb;
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float* xt = x + (long long)t * cols;
            float xl[16], xh[16];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float4 a = __ldg((const float4*)(xt + e_lo) + i), c = __ldg((const float4*)(xt + e_hi) + i);
                xl[4 * i] = a.x; xl[4 * i + 1] = a.y; xl[4 * i + 2] = a.z; xl[4 * i + 3] = a.w;
                xh[4 * i] = c.x; xh[4 * i + 1] = c.y; xh[4 * i + 2] = c.z; xh[4 * i + 3] = c.w;
            }
            const float* xst = xs + (long long)t * n8;
            float sl = xst[e_lo >> 3] + xst[(e_lo >> 3) + 1];
            float sh = xst[e_hi >> 3] + xst[(e_hi >> 3) + 1];
#pragma unroll
            for (int r = 0; r < R; r++) {
                float slo = 0.0f, shi = 0.0f;
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    u32 v = q[r][w];
                    u32 lo = ((v << 3) & 0x78787878u) | 0x80808080u;
                    u32 hi = ((v >> 1) & 0x78787878u) | 0x80808080u;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        slo = fmaf(qf_byte(lo, k), xl[4 * w + k], slo);
                        shi = fmaf(qf_byte(hi, k), xh[4 * w + k], shi);
                    }
                }
                acc[r][t] += (d1[r] * slo - c1[r] * sl) + (d2[r] * shi - c2[r] * sh);
            }
        }
    }
    mv_store<R, NT>(acc, y, r0, rows, lane);
}

// ---- Q5_K (176-byte blocks): as Q4_K with the fifth bit from qh ----
template <int R, int NT>
__device__ __forceinline__ void mv_q5_k(const u8* __restrict__ W, const float* __restrict__ x, const float* __restrict__ xs,
                                        float* __restrict__ y, int rows, int cols) {
    const int lane = threadIdx.x & 31;
    const int r0 = blockIdx.x * R, warp = threadIdx.x >> 5;
    const int nb = cols >> 8, n8 = cols >> 3;
    const int sub = lane & 7, j = sub >> 1, half = sub & 1;
    float acc[R][NT];
    MV_ZERO(acc);
#pragma unroll 2
    for (int b = (lane >> 3) + 4 * warp; b < nb; b += 16) {
        const int e_lo = b * 256 + 64 * j + 16 * half, e_hi = e_lo + 32;
        u32 ql[R][4], qhl[R][4];
        float d1[R], c1[R], d2[R], c2[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int row = min(r0 + r, rows - 1);
            const u8* blk = W + ((long long)row * nb + b) * 176;
            uint4 hd = __ldg((const uint4*)blk);
            uint4 qh = __ldg((const uint4*)(blk + 16 + 16 * half));
            uint4 qq = __ldg((const uint4*)(blk + 48 + 16 * sub));
            u32 qhw[4] = {qh.x, qh.y, qh.z, qh.w}, qsw[4] = {qq.x, qq.y, qq.z, qq.w};
#pragma unroll
            for (int w = 0; w < 4; w++) {
                ql[r][w] = (qsw[w] & 0x0F0F0F0Fu) | (((qhw[w] >> (2 * j)) & 0x01010101u) << 4);
                qhl[r][w] = ((qsw[w] >> 4) & 0x0F0F0F0Fu) | (((qhw[w] >> (2 * j + 1)) & 0x01010101u) << 4);
            }
            float d = h2f((u16)(hd.x & 0xFFFF)), dm = h2f((u16)(hd.x >> 16));
            float sa, ma, sb, mb;
            scale_min_pair(j, hd.y, hd.z, hd.w, &sa, &ma, &sb, &mb);
            d1[r] = 32.0f * (d * sa); c1[r] = d1[r] + dm * ma;
            d2[r] = 32.0f * (d * sb); c2[r] = d2[r] + dm * mb;
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float* xt = x + (long long)t * cols;
            float xl[16], xh[16];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float4 a = __ldg((const float4*)(xt + e_lo) + i), c = __ldg((const float4*)(xt + e_hi) + i);
                xl[4 * i] = a.x; xl[4 * i + 1] = a.y; xl[4 * i + 2] = a.z; xl[4 * i + 3] = a.w;
                xh[4 * i] = c.x; xh[4 * i + 1] = c.y; xh[4 * i + 2] = c.z; xh[4 * i + 3] = c.w;
            }
            const float* xst = xs + (long long)t * n8;
            float sl = xst[e_lo >> 3] + xst[(e_lo >> 3) + 1];
            float sh = xst[e_hi >> 3] + xst[(e_hi >> 3) + 1];
#pragma unroll
            for (int r = 0; r < R; r++) {
                float slo = 0.0f, shi = 0.0f;
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    u32 lo = (ql[r][w] << 2) | 0x80808080u, hi = (qhl[r][w] << 2) | 0x80808080u;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        slo = fmaf(qf_byte(lo, k), xl[4 * w + k], slo);
                        shi = fmaf(qf_byte(hi, k), xh[4 * w + k], shi);
                    }
                }
                acc[r][t] += (d1[r] * slo - c1[r] * sl) + (d2[r] * shi - c2[r] * sh);
            }
        }
    }
    mv_store<R, NT>(acc, y, r0, rows, lane);
}

// ---- Q6_K (structure of arrays): 8 lanes per block, each lane 8 positions x 4 quarters ----
template <int R, int NT>
__device__ __forceinline__ void mv_q6_k(const u8* __restrict__ W, long long nbt, const float* __restrict__ x,
                                        const float* __restrict__ xs, float* __restrict__ y, int rows, int cols) {
    const int lane = threadIdx.x & 31;
    const int r0 = blockIdx.x * R, warp = threadIdx.x >> 5;
    const int nb = cols >> 8, n8 = cols >> 3;
    const int sub = lane & 7, n = sub >> 2, k8 = sub & 3;
    const u8* QL = W;
    const u8* QH = W + nbt * 128;
    const signed char* SC = (const signed char*)(W + nbt * 192);
    const u16* D = (const u16*)(W + nbt * 208);
    float acc[R][NT];
    MV_ZERO(acc);
#pragma unroll 2
    for (int b = (lane >> 3) + 4 * warp; b < nb; b += 16) {
        u32 qv[R][4][2];  // [quarter][word]: 8 bytes (0x80 | q6 << 1)
        float ds[R][4];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int row = min(r0 + r, rows - 1);
            long long blk = (long long)row * nb + b;
            uint2 l0 = __ldg((const uint2*)(QL + blk * 128 + 64 * n + 8 * k8));
            uint2 l1 = __ldg((const uint2*)(QL + blk * 128 + 64 * n + 32 + 8 * k8));
            uint2 h = __ldg((const uint2*)(QH + blk * 64 + 32 * n + 8 * k8));
            float d = h2f(__ldg(D + blk));
            u32 lw0[2] = {l0.x, l0.y}, lw1[2] = {l1.x, l1.y}, hw[2] = {h.x, h.y};
#pragma unroll
            for (int w = 0; w < 2; w++) {
                u32 q0 = (lw0[w] & 0x0F0F0F0Fu) | (((hw[w] >> 0) & 0x03030303u) << 4);
                u32 q1 = (lw1[w] & 0x0F0F0F0Fu) | (((hw[w] >> 2) & 0x03030303u) << 4);
                u32 q2 = ((lw0[w] >> 4) & 0x0F0F0F0Fu) | (((hw[w] >> 4) & 0x03030303u) << 4);
                u32 q3 = ((lw1[w] >> 4) & 0x0F0F0F0Fu) | (((hw[w] >> 6) & 0x03030303u) << 4);
                qv[r][0][w] = (q0 << 1) | 0x80808080u;
                qv[r][1][w] = (q1 << 1) | 0x80808080u;
                qv[r][2][w] = (q2 << 1) | 0x80808080u;
                qv[r][3][w] = (q3 << 1) | 0x80808080u;
            }
            const signed char* sc = SC + blk * 16 + 8 * n + (k8 >> 1);
#pragma unroll
            for (int qt = 0; qt < 4; qt++) ds[r][qt] = d * (float)__ldg(sc + 2 * qt);
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float* xt = x + (long long)t * cols;
            const float* xst = xs + (long long)t * n8;
#pragma unroll
            for (int qt = 0; qt < 4; qt++) {
                const int e = b * 256 + 128 * n + 32 * qt + 8 * k8;
                float4 a = __ldg((const float4*)(xt + e)), c = __ldg((const float4*)(xt + e) + 1);
                float xv[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
                float sx = xst[e >> 3];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float s = 0.0f;
#pragma unroll
                    for (int i = 0; i < 8; i++) s = fmaf(qf_byte(qv[r][qt][i >> 2], i & 3), xv[i], s);
                    // w = d*sc*(q - 32) = 64 d sc qf - 96 d sc
                    acc[r][t] += 64.0f * ds[r][qt] * s - 96.0f * ds[r][qt] * sx;
                }
            }
        }
    }
    mv_store<R, NT>(acc, y, r0, rows, lane);
}

// ---- Q8_0 (structure of arrays): each lane half a block (16 weights) ----
template <int R, int NT>
__device__ __forceinline__ void mv_q8_0(const u8* __restrict__ W, long long nbt, const float* __restrict__ x,
                                        float* __restrict__ y, int rows, int cols) {
    const int lane = threadIdx.x & 31;
    const int r0 = blockIdx.x * R, warp = threadIdx.x >> 5;
    const int nb = cols >> 5;
    const u16* D = (const u16*)(W + nbt * 32);
    float acc[R][NT];
    MV_ZERO(acc);
    for (int c = lane + 32 * warp; c < 2 * nb; c += 128) {
        const int b = c >> 1, e = 16 * c;
        u32 q[R][4];
        float d[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int row = min(r0 + r, rows - 1);
            long long blk = (long long)row * nb + b;
            uint4 qq = __ldg((const uint4*)(W + blk * 32 + 16 * (c & 1)));
            q[r][0] = qq.x ^ 0x80808080u; q[r][1] = qq.y ^ 0x80808080u; q[r][2] = qq.z ^ 0x80808080u; q[r][3] = qq.w ^ 0x80808080u;
            d[r] = h2f(__ldg(D + blk));
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float* xt = x + (long long)t * cols + e;
            float xv[16];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float4 a = __ldg((const float4*)xt + i);
                xv[4 * i] = a.x; xv[4 * i + 1] = a.y; xv[4 * i + 2] = a.z; xv[4 * i + 3] = a.w;
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    // 2^23 + (q + 128), exact; minus 2^23 + 128 gives q.
                    float qf = __uint_as_float(__byte_perm(q[r][i >> 2], 0x4B000000u, 0x7440u | (u32)(i & 3)));
                    s = fmaf(qf - 8388736.0f, xv[i], s);
                }
                acc[r][t] += d[r] * s;
            }
        }
    }
    mv_store<R, NT>(acc, y, r0, rows, lane);
}

// ---- Q4_0 (structure of arrays): each lane one 32-weight block ----
template <int R, int NT>
__device__ __forceinline__ void mv_q4_0(const u8* __restrict__ W, long long nbt, const float* __restrict__ x,
                                        const float* __restrict__ xs, float* __restrict__ y, int rows, int cols) {
    const int lane = threadIdx.x & 31;
    const int r0 = blockIdx.x * R, warp = threadIdx.x >> 5;
    const int nb = cols >> 5, n8 = cols >> 3;
    const u16* D = (const u16*)(W + nbt * 16);
    float acc[R][NT];
    MV_ZERO(acc);
    for (int b = lane + 32 * warp; b < nb; b += 128) {
        u32 q[R][4];
        float d[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int row = min(r0 + r, rows - 1);
            long long blk = (long long)row * nb + b;
            uint4 qq = __ldg((const uint4*)(W + blk * 16));
            q[r][0] = qq.x; q[r][1] = qq.y; q[r][2] = qq.z; q[r][3] = qq.w;
            d[r] = h2f(__ldg(D + blk));
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float* xt = x + (long long)t * cols + 32 * b;
            float xl[16], xh[16];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float4 a = __ldg((const float4*)xt + i), c = __ldg((const float4*)(xt + 16) + i);
                xl[4 * i] = a.x; xl[4 * i + 1] = a.y; xl[4 * i + 2] = a.z; xl[4 * i + 3] = a.w;
                xh[4 * i] = c.x; xh[4 * i + 1] = c.y; xh[4 * i + 2] = c.z; xh[4 * i + 3] = c.w;
            }
            const float* xst = xs + (long long)t * n8 + 4 * b;
            float sx = (xst[0] + xst[1]) + (xst[2] + xst[3]);
#pragma unroll
            for (int r = 0; r < R; r++) {
                float s = 0.0f;
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    u32 lo = ((q[r][w] << 3) & 0x78787878u) | 0x80808080u;
                    u32 hi = ((q[r][w] >> 1) & 0x78787878u) | 0x80808080u;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        s = fmaf(qf_byte(lo, k), xl[4 * w + k], s);
                        s = fmaf(qf_byte(hi, k), xh[4 * w + k], s);
                    }
                }
                // w = d*(q - 8) = 16 d qf - 24 d
                acc[r][t] += 16.0f * d[r] * s - 24.0f * d[r] * sx;
            }
        }
    }
    mv_store<R, NT>(acc, y, r0, rows, lane);
}

// ---- F16, BF16, F32: each lane 8 consecutive weights per step ----
template <int R, int NT, int FMT>
__device__ __forceinline__ void mv_float(const u8* __restrict__ W, const float* __restrict__ x, float* __restrict__ y,
                                         int rows, int cols) {
    const int lane = threadIdx.x & 31;
    const int r0 = blockIdx.x * R, warp = threadIdx.x >> 5;
    float acc[R][NT];
    MV_ZERO(acc);
    for (int e = 8 * (lane + 32 * warp); e < cols; e += 1024) {
        float wv[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) {
            long long row = min(r0 + r, rows - 1);
            if (FMT == FMT_F32) {
                const float4* p = (const float4*)(W + (row * cols + e) * 4);
                float4 a = __ldg(p), c = __ldg(p + 1);
                wv[r][0] = a.x; wv[r][1] = a.y; wv[r][2] = a.z; wv[r][3] = a.w;
                wv[r][4] = c.x; wv[r][5] = c.y; wv[r][6] = c.z; wv[r][7] = c.w;
            } else {
                uint4 u = __ldg((const uint4*)(W + (row * cols + e) * 2));
                u32 uw[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if (FMT == FMT_F16) {
                        wv[r][2 * i] = h2f((u16)(uw[i] & 0xFFFF));
                        wv[r][2 * i + 1] = h2f((u16)(uw[i] >> 16));
                    } else {
                        wv[r][2 * i] = __uint_as_float(uw[i] << 16);
                        wv[r][2 * i + 1] = __uint_as_float(uw[i] & 0xFFFF0000u);
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4* xp = (const float4*)(x + (long long)t * cols + e);
            float4 a = __ldg(xp), c = __ldg(xp + 1);
            float xv[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int i = 0; i < 8; i++) acc[r][t] = fmaf(wv[r][i], xv[i], acc[r][t]);
        }
    }
    mv_store<R, NT>(acc, y, r0, rows, lane);
}

// Entry points mv_<format>_<R>_<NT>: a block of 4 warps computes R rows for NT tokens.
#define MV_ONE(NAME, CALL, R, NT)                                                                             \
    extern "C" __global__ void __launch_bounds__(128) mv_##NAME##_##R##_##NT(const u8* W, long long nbt,      \
        const float* x, const float* xs, float* y, int rows, int cols) { CALL; }
#define MV_FMTS(R, NT)                                                                                        \
    MV_ONE(q4_k, (mv_q4_k<R, NT>(W, x, xs, y, rows, cols)), R, NT)                                           \
    MV_ONE(q5_k, (mv_q5_k<R, NT>(W, x, xs, y, rows, cols)), R, NT)                                           \
    MV_ONE(q6_k, (mv_q6_k<R, NT>(W, nbt, x, xs, y, rows, cols)), R, NT)                                      \
    MV_ONE(q8_0, (mv_q8_0<R, NT>(W, nbt, x, y, rows, cols)), R, NT)                                          \
    MV_ONE(q4_0, (mv_q4_0<R, NT>(W, nbt, x, xs, y, rows, cols)), R, NT)                                      \
    MV_ONE(f32, (mv_float<R, NT, FMT_F32>(W, x, y, rows, cols)), R, NT)                                      \
    MV_ONE(f16, (mv_float<R, NT, FMT_F16>(W, x, y, rows, cols)), R, NT)                                      \
    MV_ONE(bf16, (mv_float<R, NT, FMT_BF16>(W, x, y, rows, cols)), R, NT)
#define MV_R(R) MV_FMTS(R, 1) MV_FMTS(R, 2) MV_FMTS(R, 4) MV_FMTS(R, 8)
MV_R(1)
MV_R(2)
MV_R(4)
