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

// ==== x-stationary matrix-vector products for one token (decode), integer dot products ====
// The kernels above read the activations from L1 once per R rows and turn every 4-bit code into a
// float with a byte permute; at decode the ALU work (permutes and masks: 10 ALU operations per 8
// weights) and the L1 traffic, not the weights, bounded them (Nsight: issue slots 55% busy, DRAM
// 28%). Here:
// - a block's threads cover every column of the matrix: thread t holds the activations its lane
//   slice of column block t >> 3 multiplies, in registers, for the whole kernel, and the block
//   walks its rows MVQ_R at a time (loads of the next rows in flight while this step computes);
// - the activations are held as fixed point: each run of 16 values gets the power-of-two scale
//   2^(E-22) with |x| < 2^E, so X = round(x 2^(22-E)) is an integer of at most 23 bits
//   (|X| <= 2^22), split into three byte planes (two unsigned, the top one signed). The error is at
//   most 2^-23 of the largest of the 16 values, the size of an f32 rounding of that value;
// - sum q X is computed exactly by dp4a (4 code x digit products per instruction) and becomes an
//   f32 once per 16 weights: 65536 S2 + (256 S1 + S0), the second term below 2^24 (exact);
// - each row's partial sums are added in a fixed order (butterfly within the warp, then warps in
//   order): the result does not depend on timing or on what else runs.
// Blocks take `rpb` consecutive rows; the host sizes the grid to one wave of resident blocks.
#define MVQ_R 4
#define MVQ_MAX_THREADS 640  // 80 column blocks of 256: columns <= 20480

__device__ __forceinline__ u32 dp4a_uu(u32 a, u32 b, u32 c) { u32 d; asm("dp4a.u32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d; }
__device__ __forceinline__ int dp4a_ss(u32 a, u32 b, int c) { int d; asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d; }
__device__ __forceinline__ int dp4a_us(u32 a, u32 b, int c) { int d; asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d; }

// N activations -> digit planes d0, d1 (unsigned bytes), d2 (signed top byte), N / 4 words each,
// the scale 2^(E-22) and their f32 sum (in order; Q6_K ignores it and the compiler drops it).
// P = 2 (`--mode fast`): X = round(x 2^(14-E)), |X| <= 2^14, planes d0 (unsigned) and d1 (the
// signed top byte), scale 2^(E-14): an error of at most 2^(E-15), 2^-14 of the run's largest value; d2 is 0.
template <int N, int P = 3>
__device__ __forceinline__ void x_digits(const float (&v)[N], u32 (&d0)[N / 4], u32 (&d1)[N / 4], u32 (&d2)[N / 4],
                                         float& scale, float& sum) {
    constexpr int BITS = 8 * P - 2;  // 22 or 14
    float m = 0.0f;
    sum = 0.0f;
    bool bad = false;
#pragma unroll
    for (int i = 0; i < N; i++) { m = fmaxf(m, fabsf(v[i])); sum += v[i]; bad |= !isfinite(v[i]); }
    int E;
    frexpf(m, &E);   // m = f 2^E with f in [0.5, 1), so |x| < 2^E (E = 0 when m = 0)
    E = bad ? 0 : max(E, -100);  // runs below 2^-100: quantized in steps of 2^-(100 + BITS)
    const float up = __int_as_float((127 + BITS - E) << 23);  // 2^(BITS - E), exact
    // A non-finite activation makes the run's scale NaN: the products that read it are NaN, as
    // a float product would be.
    scale = bad ? __int_as_float(0x7fc00000) : __int_as_float((127 - BITS + E) << 23);  // 2^(E - BITS)
#pragma unroll
    for (int w = 0; w < N / 4; w++) {
        u32 a = 0, b = 0, c = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int X = __float2int_rn(v[4 * w + k] * up);  // |X| <= 2^BITS: top digit in [-64, 64]
            a |= (u32)(X & 0xFF) << (8 * k);
            b |= (u32)((X >> 8) & 0xFF) << (8 * k);
            if (P == 3) c |= (u32)((X >> 16) & 0xFF) << (8 * k);
        }
        d0[w] = a; d1[w] = b; d2[w] = c;
    }
}

// The four partial rows of a step summed over the warp with 5 shuffles instead of 20: lanes
// l and l ^ 16 trade two rows, then l and l ^ 8 one, then the usual butterfly over 4, 2, 1. Lane 8i
// ends with row i ((lane >> 4) * 2 + (lane >> 3 & 1)). A fixed order, whatever the timing.
__device__ __forceinline__ float warp_sum4(const float (&v)[4], int lane) {
    const bool up = lane & 16, up8 = lane & 8;
    float k0 = up ? v[2] : v[0], k1 = up ? v[3] : v[1];
    const float s0 = up ? v[0] : v[2], s1 = up ? v[1] : v[3];
    k0 += __shfl_xor_sync(0xffffffffu, s0, 16);
    k1 += __shfl_xor_sync(0xffffffffu, s1, 16);
    float k = up8 ? k1 : k0;
    k += __shfl_xor_sync(0xffffffffu, up8 ? k0 : k1, 8);
    k += __shfl_xor_sync(0xffffffffu, k, 4);
    k += __shfl_xor_sync(0xffffffffu, k, 2);
    k += __shfl_xor_sync(0xffffffffu, k, 1);
    return k;
}

// The end of a step: each of the MVQ_R partial rows summed over the block (within the warp by
// warp_sum4, then warps in order), one smem slot per warp, double-buffered by step parity (a warp can
// only overwrite this step's slots after the next barrier, which threads 0..NT*STEP-1 reach after
// reading them). FUSED: slots STEP.. hold the up rows and y gets the SwiGLU (the swiglu kernel's
// expression). NT tokens (the few-token forms, not FUSED): acc[k] is token k's, its rows go to
// y + k ystride, each summed exactly as a one-token launch sums it (the same bits). MVQ_SUM4=0
// (a measurement define): each row by its own butterfly (warp_sum), 20 shuffles a step instead
// of 5; another fixed order, so other bits.
#ifndef MVQ_SUM4
#define MVQ_SUM4 1
#endif
template <int STEP, bool FUSED, int NT = 1>
__device__ __forceinline__ void mvq_finish(const float (&acc)[NT][MVQ_R], float (*red)[MVQ_MAX_THREADS / 32][NT * MVQ_R], int it,
                                           float* __restrict__ y, long long ystride, int r0, int r_end, int tid, int lane,
                                           int warp, int nw) {
    static_assert(MVQ_R == 4, "warp_sum4 sums four rows");
    static_assert(NT == 1 || !FUSED, "the fused SwiGLU takes one token");
#pragma unroll
    for (int k = 0; k < NT; k++) {
#if MVQ_SUM4
        const float v = warp_sum4(acc[k], lane);
        if ((lane & 7) == 0) red[it][warp][k * MVQ_R + (lane >> 3)] = v;
#else
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
            const float v = warp_sum(acc[k][r]);
            if (lane == 0) red[it][warp][k * MVQ_R + r] = v;
        }
#endif
    }
    __syncthreads();
    // Thread k STEP + i: token k's row r0 + i (STEP = MVQ_R whenever NT > 1).
    const int k = tid / STEP, i = tid - k * STEP;
    if (k < NT && r0 + i < r_end) {
        float s = 0.0f;
        for (int w = 0; w < nw; w++) s += red[it][w][tid];
        if (FUSED) {
            float u = 0.0f;
            for (int w = 0; w < nw; w++) u += red[it][w][tid + STEP];
            const double gv = s;
            s = (float)__dmul_rn(gv / (1.0 + exp(-gv)), (double)u);
        }
        y[k * ystride + r0 + i] = s;
    }
}

// Column-split launches (SPLIT, the matrices wider than 256 threads cover): blockIdx.y takes
// column blocks [y nbs, (y + 1) nbs) of every row (nbs <= 32: the prefetching kernels' 256
// threads), and writes its partial rows to part[y][rows]. The last block of a row range to finish
// (a counter per range, reset by that block for the next launch) adds the ranges in order,
// ((p0 + p1) + p2) ..., into y: a fixed order whatever the timing. NT tokens: range c's partial
// rows of token k at part[(c NT + k) rows], token k's sums to y + k rows.
// Every block of the launch must reach this (no early return before it): a block that did not
// would leave its range's counter short and the next launch's count wrong.
template <int NT = 1>
__device__ __forceinline__ void mvq_split_sum(const float* __restrict__ part, float* __restrict__ y, unsigned* cnt, int rows,
                                              int r_begin, int r_end) {
    __shared__ bool last;
    __threadfence();  // this block's partial rows, visible to the block that adds them
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&cnt[blockIdx.x], 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
#pragma unroll
    for (int k = 0; k < NT; k++)
        for (int r = r_begin + (int)threadIdx.x; r < r_end; r += blockDim.x) {
            float s = 0.0f;
            for (int c = 0; c < (int)gridDim.y; c++) s += __ldcg(part + ((long long)c * NT + k) * rows + r);
            y[(long long)k * rows + r] = s;
        }
    if (threadIdx.x == 0) cnt[blockIdx.x] = 0u;
}

// Pair launches (PAIR): the rows of two matrices of one shape, W's then W2's, as 2 x rows
// virtual rows; a step of MVQ_R rows never straddles the two (the host checks rows % MVQ_R == 0).
// Virtual row v -> the matrix holding it, and v becomes its row there.
template <bool PAIR>
__device__ __forceinline__ const u8* mvq_seg(const u8* W, const u8* W2, int& v, int rows) {
    if (PAIR && v >= rows) { v -= rows; return W2; }
    return W;
}

// Group launches (GROUP): up to four matrices of one width and format that read the same x (the
// attention's Q, gate, K and V), their rows one after another as virtual rows: matrix i holds
// virtual rows [s_i, s_{i+1}) (s_0 = 0, s_4 = vrows; a segment past the group's matrices is
// empty); a step of MVQ_R rows never straddles two (the host checks rows % MVQ_R == 0 for each).
struct MvqGroup {
    const u8* w0; const u8* w1; const u8* w2; const u8* w3;
    float* y0; float* y1; float* y2; float* y3;
    int s1, s2, s3, vrows;
};
// The matrix and output holding virtual row v; returns its first virtual row, `end` its last + 1.
__device__ __forceinline__ int mvq_gseg(const MvqGroup& g, int v, const u8*& M, float*& Y, int& end) {
    if (v < g.s1) { M = g.w0; Y = g.y0; end = g.s1; return 0; }
    if (v < g.s2) { M = g.w1; Y = g.y1; end = g.s2; return g.s1; }
    if (v < g.s3) { M = g.w2; Y = g.y2; end = g.s3; return g.s2; }
    M = g.w3; Y = g.y3; end = g.vrows; return g.s3;
}

// Rows r0.. of W; FUSED: rows r0, r0 + 1 of W and of W2 (the FFN's gate and up); PAIR: virtual
// rows r0.. (of vrows = 2 rows).
template <bool FUSED, bool PAIR>
__device__ __forceinline__ void mvq_load_q4k(const u8* __restrict__ W, const u8* __restrict__ W2, int r0, int rows, int nb,
                                             int b, int sub, uint4 (&hd)[MVQ_R], uint4 (&qq)[MVQ_R]) {
    const int vrows = PAIR ? 2 * rows : rows;
#pragma unroll
    for (int r = 0; r < MVQ_R; r++) {
        int row = FUSED ? r0 + (r % (MVQ_R / 2)) : r0 + r;
        row = min(row, vrows - 1);
        const u8* M = (FUSED && r >= MVQ_R / 2) ? W2 : mvq_seg<PAIR>(W, W2, row, rows);
        const u8* blk = M + ((long long)row * nb + b) * 144;
        hd[r] = __ldg((const uint4*)blk);
        qq[r] = __ldg((const uint4*)(blk + 16 + 16 * sub));
    }
}

// A lane's 16 bytes of Q4_K codes (32 weights) against one token's digits: the low nibbles with
// (l0, l1, l2), the high ones taken in place as 16 q (q4_hi) with (h0, h1, h2); each sum exact in
// integers (dp4a), then one rounding to f32 times its run's scale (lsc, hsc). The register and
// staged Q4_K kernels share it.
// Three planes: sum q X = 65536 S2 + (256 S1 + S0): S0, S1 <= 16 * 15 * 255, so the second term
// is below 2^24 and exact in f32; one rounding in the fma. Two: 256 S1 + S0 with |S1| <= 16 * 15
// * 64, exact. The high nibbles' sums are 16 times these (q4_hi): still exact, the same rounding
// scaled by 16, undone by hsc / 16.
template <int P>
__device__ __forceinline__ void q4_dots(const u32 (&q)[4], const u32 (&l0)[4], const u32 (&l1)[4], const u32 (&l2)[4],
                                        const u32 (&h0)[4], const u32 (&h1)[4], const u32 (&h2)[4], float lsc, float hsc,
                                        float& qx_lo, float& qx_hi) {
    u32 a0 = 0, a1 = 0, c0 = 0, c1 = 0;
    int a2 = 0, c2 = 0;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const u32 lo = q[w] & 0x0F0F0F0Fu, hi = q[w] & 0xF0F0F0F0u;  // hi: 16 q (q4_hi)
        if (P == 3) {
            a0 = dp4a_uu(lo, l0[w], a0); a1 = dp4a_uu(lo, l1[w], a1); a2 = dp4a_ss(lo, l2[w], a2);
            c0 = dp4a_uu(hi, h0[w], c0); c1 = dp4a_uu(hi, h1[w], c1); c2 = dp4a_us(hi, h2[w], c2);
        } else {  // the top plane (signed) is the second
            a0 = dp4a_uu(lo, l0[w], a0); a2 = dp4a_ss(lo, l1[w], a2);
            c0 = dp4a_uu(hi, h0[w], c0); c2 = dp4a_us(hi, h1[w], c2);
        }
    }
    qx_lo = (P == 3 ? fmaf(65536.0f, (float)a2, (float)(int)(256u * a1 + a0)) : fmaf(256.0f, (float)a2, (float)(int)a0)) * lsc;
    qx_hi = (P == 3 ? fmaf(65536.0f, (float)c2, (float)(int)(256u * c1 + c0)) : fmaf(256.0f, (float)c2, (float)(int)c0)) * hsc;
}

// Q4_K: 8 lanes per 256-weight block, each 16 bytes of codes: weights 64j + 16h + [0, 16) from the
// low nibbles and 32 later from the high ones (j = sub / 2, h = sub % 2).
// q4_hi: the high nibbles are taken in place (code & 0xF0, that is 16 q: one AND a word instead of
// a shift and an AND), multiplied by the digits with the code unsigned (dp4a_us for the signed top
// plane), and their run's scale is divided by 16. Every sum is 16 times the integer it was (at most
// 16 * 240 * 255 a plane, 257 times that combined: below 2^31, and a multiple of 16 of an integer
// below 2^24, so exact in f32); the fma's one rounding scales by 16 with it (powers of two, far from
// the f32 range's ends: scales of at least 2^-126), and the product with scale / 16 is the product
// it was. The same bits.
// FUSED: y[r] = silu(W x)[r] * (W2 x)[r] (the FFN's gate and up with its SwiGLU), MVQ_R / 2 rows of
// each per step; each product is summed exactly as unfused, and the SwiGLU is the swiglu kernel's.
// PAIR: y = W x and y2 = W2 x in one launch (each row's arithmetic as alone: the same bits).
// SPLIT: column range blockIdx.y (nbs blocks each), partial rows to part, mvq_split_sum.
// P: digit planes of the activations (3; 2 in `--mode fast`, x_digits).
// GROUP: the virtual rows of *grp (rows = its vrows); W, W2, y, y2 unused. Each row's arithmetic as
// alone: the same bits.
template <bool PF, bool FUSED, bool PAIR = false, bool SPLIT = false, int P = 3, bool GROUP = false, int NT = 1>
__device__ __forceinline__ void mvq_q4_k(const u8* __restrict__ W, const u8* __restrict__ W2, const float* __restrict__ x,
                                         float* __restrict__ y, float* __restrict__ y2, int rows, int cols, int rpb,
                                         float* __restrict__ part = nullptr, unsigned* cnt = nullptr, int nbs = 0,
                                         const MvqGroup* grp = nullptr) {
    constexpr int STEP = FUSED ? MVQ_R / 2 : MVQ_R;  // output rows per step
    __shared__ float red[2][MVQ_MAX_THREADS / 32][NT * MVQ_R];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const int nb = cols >> 8, b0 = tid >> 3, sub = tid & 7, j = sub >> 1, half = sub & 1;
    const int b_off = SPLIT ? blockIdx.y * nbs : 0;
    const bool on = b0 < (SPLIT ? min(nbs, nb - b_off) : nb);
    const int b = (on ? b0 : 0) + b_off;
    const int e_lo = b * 256 + 64 * j + 16 * half, e_hi = e_lo + 32;
    const int r_begin = blockIdx.x * rpb, r_end = min(PAIR ? 2 * rows : rows, r_begin + rpb);
    uint4 hd[MVQ_R], qq[MVQ_R], nhd[MVQ_R], nqq[MVQ_R];
    // Rows r0.. (a step) into (h, q): of the group's matrix that holds them, or as above.
    auto load = [&](int r0, uint4 (&h)[MVQ_R], uint4 (&q)[MVQ_R]) {
        if (GROUP) {
            const u8* M;
            float* Y;
            int end;
            const int s0 = mvq_gseg(*grp, r0, M, Y, end);
            mvq_load_q4k<false, false>(M, M, r0 - s0, end - s0, nb, b, sub, h, q);
        } else {
            mvq_load_q4k<FUSED, PAIR>(W, W2, r0, rows, nb, b, sub, h, q);
        }
    };
    // The first rows' weights (they do not depend on x) in flight while x becomes digits, and,
    // launched programmatically (lib.rs launch_raw), while the kernel before finishes.
    pdl_trigger();
    if (PF && r_begin < r_end) load(r_begin, nhd, nqq);
    pdl_wait();
    // Token k's digits (x + k cols), as a one-token launch makes them.
    u32 l0[NT][4], l1[NT][4], l2[NT][4], h0[NT][4], h1[NT][4], h2[NT][4];
    float lsc[NT], lsum[NT], hsc[NT], hsum[NT];
#pragma unroll
    for (int k = 0; k < NT; k++) {
        const float* xk = x + (long long)k * cols;
        float v[16];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float4 a = ld_after_wait(xk + e_lo + 4 * i);
            v[4 * i] = a.x; v[4 * i + 1] = a.y; v[4 * i + 2] = a.z; v[4 * i + 3] = a.w;
        }
        x_digits<16, P>(v, l0[k], l1[k], l2[k], lsc[k], lsum[k]);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float4 a = ld_after_wait(xk + e_hi + 4 * i);
            v[4 * i] = a.x; v[4 * i + 1] = a.y; v[4 * i + 2] = a.z; v[4 * i + 3] = a.w;
        }
        x_digits<16, P>(v, h0[k], h1[k], h2[k], hsc[k], hsum[k]);
        hsc[k] *= 0.0625f;  // the high nibbles are taken in place, as 16 q (q4_hi): 2^(E - BITS - 4), exact
    }
    // This launch's rows of W (a split launch: its range's NT token slices of part).
    float* yp = SPLIT ? part + (long long)blockIdx.y * NT * rows : y;
    int it = 0;
    for (int r0 = r_begin; r0 < r_end; r0 += STEP, it ^= 1) {
        if (PF) {
#pragma unroll
            for (int r = 0; r < MVQ_R; r++) { hd[r] = nhd[r]; qq[r] = nqq[r]; }
            if (r0 + STEP < r_end) load(r0 + STEP, nhd, nqq);
        } else {
            load(r0, hd, qq);
        }
        float acc[NT][MVQ_R];
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
            const u32 q[4] = {qq[r].x, qq[r].y, qq[r].z, qq[r].w};
            const float d = h2f((u16)(hd[r].x & 0xFFFF)), dm = h2f((u16)(hd[r].x >> 16));
            float sa, ma, sb, mb;
            scale_min_pair(j, hd[r].y, hd[r].z, hd[r].w, &sa, &ma, &sb, &mb);
#pragma unroll
            for (int k = 0; k < NT; k++) {
                float qx_lo, qx_hi;
                q4_dots<P>(q, l0[k], l1[k], l2[k], h0[k], h1[k], h2[k], lsc[k], hsc[k], qx_lo, qx_hi);
                // w = d sc q - dmin m
                acc[k][r] = on ? ((d * sa) * qx_lo - (dm * ma) * lsum[k]) + ((d * sb) * qx_hi - (dm * mb) * hsum[k]) : 0.0f;
            }
        }
        if (GROUP) {
            const u8* M;
            float* Y;
            int end;
            const int s0 = mvq_gseg(*grp, r0, M, Y, end);
            mvq_finish<STEP, FUSED, NT>(acc, red, it, Y, end - s0, r0 - s0, min(r_end, end) - s0, tid, lane, warp, nw);
        } else if (PAIR && r0 >= rows) {
            mvq_finish<STEP, FUSED, NT>(acc, red, it, y2, rows, r0 - rows, r_end - rows, tid, lane, warp, nw);
        } else {
            mvq_finish<STEP, FUSED, NT>(acc, red, it, yp, rows, r0, PAIR ? min(r_end, rows) : r_end, tid, lane, warp, nw);
        }
    }
    if (SPLIT) mvq_split_sum<NT>(part, y, cnt, rows, r_begin, r_end);
}

// The register forms' launch bound: at least MVQ_MIN_BLOCKS blocks of 256 threads per SM
// (MUSER_NVRTC_DEFINES=MVQ_MIN_BLOCKS=3, for measuring: ptxas then holds them to 80 registers and
// spills; 1 leaves ptxas free: 96 to 128 registers in the two-plane forms, 2 blocks of 208 threads per SM). Registers
// and spills do not change the arithmetic: the same bits.
#ifndef MVQ_MIN_BLOCKS
#define MVQ_MIN_BLOCKS 1
#endif

// Up to 256 threads (columns <= 8192): the next rows' loads in flight during this step. Wider:
// without (its registers would spill at 640 threads).
extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q4_k(const u8* W, const float* x, float* y, int rows, int cols, int rpb) {
    mvq_q4_k<true, false>(W, W, x, y, y, rows, cols, rpb);
}
extern "C" __global__ void __launch_bounds__(MVQ_MAX_THREADS) mvq_q4_k_wide(const u8* W, const float* x, float* y, int rows, int cols, int rpb) {
    mvq_q4_k<false, false>(W, W, x, y, y, rows, cols, rpb);
}
extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q4_k_swiglu(const u8* Wg, const u8* Wu, const float* x, float* y, int rows, int cols, int rpb) {
    mvq_q4_k<true, true>(Wg, Wu, x, y, y, rows, cols, rpb);
}
extern "C" __global__ void __launch_bounds__(MVQ_MAX_THREADS) mvq_q4_k_swiglu_wide(const u8* Wg, const u8* Wu, const float* x, float* y, int rows, int cols, int rpb) {
    mvq_q4_k<false, true>(Wg, Wu, x, y, y, rows, cols, rpb);
}
// Matrices wider than 8192 columns in column ranges of nbs blocks (grid.y ranges): prefetching
// like mvq_q4_k, where mvq_q4_k_wide cannot (its registers would spill at 640 threads).
extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q4_k_split(const u8* W, const float* x, float* y, int rows, int cols, int rpb,
                                                                 float* part, unsigned* cnt, int nbs) {
    mvq_q4_k<true, false, false, true>(W, W, x, y, y, rows, cols, rpb, part, cnt, nbs);
}
// y = W x and y2 = W2 x, two matrices of one shape (Q and the attention gate, K and V, the FFN's
// gate and up): one launch, each row's bits as alone. Up to 256 threads.
extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q4_k_pair(const u8* W, const u8* W2, const float* x, float* y, float* y2, int rows, int cols, int rpb) {
    mvq_q4_k<true, false, true>(W, W2, x, y, y2, rows, cols, rpb);
}
// `--mode fast`: the same kernels with two digit planes (P = 2).
extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q4_k_p2(const u8* W, const float* x, float* y, int rows, int cols, int rpb) {
    mvq_q4_k<true, false, false, false, 2>(W, W, x, y, y, rows, cols, rpb);
}
extern "C" __global__ void __launch_bounds__(MVQ_MAX_THREADS) mvq_q4_k_wide_p2(const u8* W, const float* x, float* y, int rows, int cols, int rpb) {
    mvq_q4_k<false, false, false, false, 2>(W, W, x, y, y, rows, cols, rpb);
}
extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q4_k_split_p2(const u8* W, const float* x, float* y, int rows, int cols, int rpb,
                                                                    float* part, unsigned* cnt, int nbs) {
    mvq_q4_k<true, false, false, true, 2>(W, W, x, y, y, rows, cols, rpb, part, cnt, nbs);
}
extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q4_k_pair_p2(const u8* W, const u8* W2, const float* x, float* y, float* y2, int rows, int cols, int rpb) {
    mvq_q4_k<true, false, true, false, 2>(W, W2, x, y, y2, rows, cols, rpb);
}
// y_i = W_i x for up to four matrices of one width (Q, the attention gate, K, V): one launch over
// their rows (MvqGroup), each row's bits as alone. Up to 256 threads. P = 3, and 2 (`_p2`).
// NT tokens (`_n2`, `_n3`): x holds NT rows of cols values, each output NT rows of its matrix's.
#define MVQ_GROUP(NAME, P, NT)                                                                                      \
    extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) NAME(const u8* W0, const u8* W1, const u8* W2, const u8* W3,   \
                                                           const float* x, float* y0, float* y1, float* y2, float* y3, \
                                                           int s1, int s2, int s3, int vrows, int cols, int rpb) {     \
        const MvqGroup g{W0, W1, W2, W3, y0, y1, y2, y3, s1, s2, s3, vrows};                                        \
        mvq_q4_k<true, false, false, false, P, true, NT>(W0, W0, x, y0, y0, vrows, cols, rpb, nullptr, nullptr, 0, &g); \
    }
MVQ_GROUP(mvq_q4_k_group, 3, 1)
MVQ_GROUP(mvq_q4_k_group_p2, 2, 1)
MVQ_GROUP(mvq_q4_k_group_n2, 3, 2)
MVQ_GROUP(mvq_q4_k_group_p2_n2, 2, 2)
MVQ_GROUP(mvq_q4_k_group_n3, 3, 3)
MVQ_GROUP(mvq_q4_k_group_p2_n3, 2, 3)

// The few-token forms of the register kernels (prefetching, at most 256 threads): NT tokens, x
// NT rows of cols values, y (and y2) NT rows of rows values; each token's bits as in a one-token
// launch of the same family.
#define MVQ_Q4_FEW(SUF, P, NT)                                                                                                   \
    extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q4_k##SUF(const u8* W, const float* x, float* y,      \
                                                                                  int rows, int cols, int rpb) {             \
        mvq_q4_k<true, false, false, false, P, false, NT>(W, W, x, y, y, rows, cols, rpb);                                     \
    }                                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q4_k_split##SUF(                                    \
        const u8* W, const float* x, float* y, int rows, int cols, int rpb, float* part, unsigned* cnt, int nbs) {             \
        mvq_q4_k<true, false, false, true, P, false, NT>(W, W, x, y, y, rows, cols, rpb, part, cnt, nbs);                      \
    }                                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q4_k_pair##SUF(                                     \
        const u8* W, const u8* W2, const float* x, float* y, float* y2, int rows, int cols, int rpb) {                         \
        mvq_q4_k<true, false, true, false, P, false, NT>(W, W2, x, y, y2, rows, cols, rpb);                                    \
    }
MVQ_Q4_FEW(_n2, 3, 2)
MVQ_Q4_FEW(_p2_n2, 2, 2)
MVQ_Q4_FEW(_n3, 3, 3)
MVQ_Q4_FEW(_p2_n3, 2, 3)

__device__ __forceinline__ int dp4a_su(u32 a, u32 b, int c) { int d; asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c)); return d; }

// A Q6_K lane's activations (block b, half n, 8 positions k8 of each quarter) as digit planes
// and scales, runs of 8 (mvq_q6_k and its staged form), and for each plane and quarter -32 times
// the sum of its 8 digits (xc: signed for the top plane, unsigned below it), where q6_dot_codes'
// integer sums start.
template <int P>
__device__ __forceinline__ void q6_x_digits(const float* __restrict__ x, int b, int n, int k8, u32 (&x0)[4][2], u32 (&x1)[4][2],
                                            u32 (&x2)[4][2], float (&xsc)[4], int (&xc)[3][4]) {
#pragma unroll
    for (int qt = 0; qt < 4; qt++) {
        const int e = b * 256 + 128 * n + 32 * qt + 8 * k8;
        const float4 a = ld_after_wait(x + e), c = ld_after_wait(x + e + 4);
        const float v[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
        float unused;
        x_digits<8, P>(v, x0[qt], x1[qt], x2[qt], xsc[qt], unused);
        const u32 ones = 0x01010101u;
        xc[0][qt] = -32 * (int)dp4a_uu(x0[qt][1], ones, dp4a_uu(x0[qt][0], ones, 0u));
        xc[1][qt] = -32 * (P == 3 ? (int)dp4a_uu(x1[qt][1], ones, dp4a_uu(x1[qt][0], ones, 0u))
                                  : dp4a_su(x1[qt][1], ones, dp4a_su(x1[qt][0], ones, 0)));
        xc[2][qt] = P == 3 ? -32 * dp4a_su(x2[qt][1], ones, dp4a_su(x2[qt][0], ones, 0)) : 0;
    }
}

// One Q6_K row's part for a lane (8 positions x 4 quarters of one block): q6_codes makes the
// lane's 6-bit codes of the four quarters once for all the tokens of a launch, q6_dot_codes a
// token's dot with them. The weights are q - 32 with q the 6-bit code (low nibble from l0 or l1,
// 2-bit top from h): sum (q - 32) X = sum q X - 32 sum X, the same integer, so each plane's dp4a
// sum over the raw codes starts at xc (q6_x_digits) and no bytewise subtraction is needed (|S0|,
// |S1| <= 8 * 32 * 255, 256 S1 + S0 < 2^24, exact in f32; the u32 sums wrap to the exact signed
// value). Each quarter adds d sc (q . X) 2^(E-B) in order. mvq_q6_k and its staged form share
// them (the same bits).
__device__ __forceinline__ void q6_codes(uint2 l0, uint2 l1, uint2 h, u32 (&qv)[4][2]) {
    const u32 lw0[2] = {l0.x, l0.y}, lw1[2] = {l1.x, l1.y}, hw[2] = {h.x, h.y};
#pragma unroll
    for (int w = 0; w < 2; w++) {
        qv[0][w] = (lw0[w] & 0x0F0F0F0Fu) | ((hw[w] << 4) & 0x30303030u);
        qv[1][w] = (lw1[w] & 0x0F0F0F0Fu) | ((hw[w] << 2) & 0x30303030u);
        qv[2][w] = ((lw0[w] >> 4) & 0x0F0F0F0Fu) | (hw[w] & 0x30303030u);
        qv[3][w] = ((lw1[w] >> 4) & 0x0F0F0F0Fu) | ((hw[w] >> 2) & 0x30303030u);
    }
}
template <int P>
__device__ __forceinline__ float q6_dot_codes(const u32 (&qv)[4][2], u32 scw, float d, const u32 (&x0)[4][2],
                                              const u32 (&x1)[4][2], const u32 (&x2)[4][2], const float (&xsc)[4],
                                              const int (&xc)[3][4]) {
    float a = 0.0f;
#pragma unroll
    for (int qt = 0; qt < 4; qt++) {
        float qx;
        if (P == 3) {
            const int s0 = (int)dp4a_uu(qv[qt][1], x0[qt][1], dp4a_uu(qv[qt][0], x0[qt][0], (u32)xc[0][qt]));
            const int s1 = (int)dp4a_uu(qv[qt][1], x1[qt][1], dp4a_uu(qv[qt][0], x1[qt][0], (u32)xc[1][qt]));
            const int s2 = dp4a_us(qv[qt][1], x2[qt][1], dp4a_us(qv[qt][0], x2[qt][0], xc[2][qt]));
            qx = fmaf(65536.0f, (float)s2, (float)(256 * s1 + s0)) * xsc[qt];
        } else {  // two planes: the top one (signed) is x1; |S1| <= 8 * 32 * 64, exact
            const int s0 = (int)dp4a_uu(qv[qt][1], x0[qt][1], dp4a_uu(qv[qt][0], x0[qt][0], (u32)xc[0][qt]));
            const int s1 = dp4a_us(qv[qt][1], x1[qt][1], dp4a_us(qv[qt][0], x1[qt][0], xc[1][qt]));
            qx = fmaf(256.0f, (float)s1, (float)s0) * xsc[qt];
        }
        const float sc = (float)(signed char)((scw >> (8 * qt)) & 0xFFu);
        a = fmaf(d * sc, qx, a);  // w = d sc (q - 32)
    }
    return a;
}

// Q6_K (structure of arrays, as mv_q6_k): 8 lanes per block, each 8 positions x 4 quarters;
// sum (q - 32) X exact in integers (q6_dot_codes). NT tokens: as mvq_q4_k's.
template <bool PF, bool PAIR = false, bool SPLIT = false, int P = 3, int NT = 1>
__device__ __forceinline__ void mvq_q6_k(const u8* __restrict__ W, const u8* __restrict__ W2, long long nbt, const float* __restrict__ x,
                                         float* __restrict__ y, float* __restrict__ y2, int rows, int cols, int rpb,
                                         float* __restrict__ part = nullptr, unsigned* cnt = nullptr, int nbs = 0) {
    __shared__ float red[2][MVQ_MAX_THREADS / 32][NT * MVQ_R];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const int nb = cols >> 8, b0 = tid >> 3, sub = tid & 7, n = sub >> 2, k8 = sub & 3;
    const int b_off = SPLIT ? blockIdx.y * nbs : 0;
    const bool on = b0 < (SPLIT ? min(nbs, nb - b_off) : nb);
    const int b = (on ? b0 : 0) + b_off;
    const int r_begin = blockIdx.x * rpb, r_end = min(PAIR ? 2 * rows : rows, r_begin + rpb);
    uint2 l0[MVQ_R], l1[MVQ_R], h[MVQ_R], nl0[MVQ_R], nl1[MVQ_R], nh[MVQ_R];
    u32 scw[MVQ_R], nscw[MVQ_R];
    float d[MVQ_R], nd[MVQ_R];
    // Codes, scales and d of (virtual) rows r0.. (the lane's four scales: bytes 8n + k8/2 + 2qt
    // of 16).
    auto load = [&](int r0, uint2 (&L0)[MVQ_R], uint2 (&L1)[MVQ_R], uint2 (&H)[MVQ_R], u32 (&S)[MVQ_R], float (&Dd)[MVQ_R]) {
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
            int row = min(r0 + r, (PAIR ? 2 * rows : rows) - 1);
            const u8* M = mvq_seg<PAIR>(W, W2, row, rows);
            const u8* QL = M;
            const u8* QH = M + nbt * 128;
            const u8* SC = M + nbt * 192;
            const u16* D = (const u16*)(M + nbt * 208);
            const long long blk = (long long)row * nb + b;
            L0[r] = __ldg((const uint2*)(QL + blk * 128 + 64 * n + 8 * k8));
            L1[r] = __ldg((const uint2*)(QL + blk * 128 + 64 * n + 32 + 8 * k8));
            H[r] = __ldg((const uint2*)(QH + blk * 64 + 32 * n + 8 * k8));
            Dd[r] = h2f(__ldg(D + blk));
            const u32* s4 = (const u32*)(SC + blk * 16 + 8 * n);
            const u32 w0 = __ldg(s4), w1 = __ldg(s4 + 1);
            S[r] = (k8 >> 1) ? __byte_perm(w0, w1, 0x7531) : __byte_perm(w0, w1, 0x6420);
        }
    };
    // The first rows' weights (they do not depend on x) in flight while x becomes digits, and,
    // launched programmatically, while the kernel before finishes.
    pdl_trigger();
    if (PF && r_begin < r_end) load(r_begin, nl0, nl1, nh, nscw, nd);
    pdl_wait();
    // Token k's digits (x + k cols), as a one-token launch makes them.
    u32 x0[NT][4][2], x1[NT][4][2], x2[NT][4][2];
    float xsc[NT][4];
    int xc[NT][3][4];
#pragma unroll
    for (int t = 0; t < NT; t++) q6_x_digits<P>(x + (long long)t * cols, b, n, k8, x0[t], x1[t], x2[t], xsc[t], xc[t]);
    float* yp = SPLIT ? part + (long long)blockIdx.y * NT * rows : y;  // this launch's rows of W
    int it = 0;
    for (int r0 = r_begin; r0 < r_end; r0 += MVQ_R, it ^= 1) {
        if (PF) {
#pragma unroll
            for (int r = 0; r < MVQ_R; r++) { l0[r] = nl0[r]; l1[r] = nl1[r]; h[r] = nh[r]; scw[r] = nscw[r]; d[r] = nd[r]; }
            if (r0 + MVQ_R < r_end) load(r0 + MVQ_R, nl0, nl1, nh, nscw, nd);
        } else {
            load(r0, l0, l1, h, scw, d);
        }
        float acc[NT][MVQ_R];
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
            u32 qv[4][2];
            q6_codes(l0[r], l1[r], h[r], qv);
#pragma unroll
            for (int t = 0; t < NT; t++)
                acc[t][r] = on ? q6_dot_codes<P>(qv, scw[r], d[r], x0[t], x1[t], x2[t], xsc[t], xc[t]) : 0.0f;
        }
        if (PAIR && r0 >= rows) mvq_finish<MVQ_R, false, NT>(acc, red, it, y2, rows, r0 - rows, r_end - rows, tid, lane, warp, nw);
        else mvq_finish<MVQ_R, false, NT>(acc, red, it, yp, rows, r0, PAIR ? min(r_end, rows) : r_end, tid, lane, warp, nw);
    }
    if (SPLIT) mvq_split_sum<NT>(part, y, cnt, rows, r_begin, r_end);
}

extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q6_k(const u8* W, long long nbt, const float* x, float* y, int rows, int cols, int rpb) {
    mvq_q6_k<true>(W, W, nbt, x, y, y, rows, cols, rpb);
}
extern "C" __global__ void __launch_bounds__(MVQ_MAX_THREADS) mvq_q6_k_wide(const u8* W, long long nbt, const float* x, float* y, int rows, int cols, int rpb) {
    mvq_q6_k<false>(W, W, nbt, x, y, y, rows, cols, rpb);
}
// The column-split form of mvq_q6_k (as mvq_q4_k_split).
extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q6_k_split(const u8* W, long long nbt, const float* x, float* y, int rows, int cols, int rpb,
                                                                 float* part, unsigned* cnt, int nbs) {
    mvq_q6_k<true, false, true>(W, W, nbt, x, y, y, rows, cols, rpb, part, cnt, nbs);
}
// The pair form of mvq_q6_k (two matrices of one shape; nbt is each one's block count).
extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q6_k_pair(const u8* W, const u8* W2, long long nbt, const float* x, float* y, float* y2, int rows, int cols, int rpb) {
    mvq_q6_k<true, true>(W, W2, nbt, x, y, y2, rows, cols, rpb);
}
// `--mode fast`: the same kernels with two digit planes (P = 2).
extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q6_k_p2(const u8* W, long long nbt, const float* x, float* y, int rows, int cols, int rpb) {
    mvq_q6_k<true, false, false, 2>(W, W, nbt, x, y, y, rows, cols, rpb);
}
extern "C" __global__ void __launch_bounds__(MVQ_MAX_THREADS) mvq_q6_k_wide_p2(const u8* W, long long nbt, const float* x, float* y, int rows, int cols, int rpb) {
    mvq_q6_k<false, false, false, 2>(W, W, nbt, x, y, y, rows, cols, rpb);
}
extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q6_k_split_p2(const u8* W, long long nbt, const float* x, float* y, int rows, int cols, int rpb,
                                                                    float* part, unsigned* cnt, int nbs) {
    mvq_q6_k<true, false, true, 2>(W, W, nbt, x, y, y, rows, cols, rpb, part, cnt, nbs);
}
extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q6_k_pair_p2(const u8* W, const u8* W2, long long nbt, const float* x, float* y, float* y2, int rows, int cols, int rpb) {
    mvq_q6_k<true, true, false, 2>(W, W2, nbt, x, y, y2, rows, cols, rpb);
}
// The few-token forms (as MVQ_Q4_FEW).
#define MVQ_Q6_FEW(SUF, P, NT)                                                                                                   \
    extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q6_k##SUF(const u8* W, long long nbt, const float* x,  \
                                                                                  float* y, int rows, int cols, int rpb) {   \
        mvq_q6_k<true, false, false, P, NT>(W, W, nbt, x, y, y, rows, cols, rpb);                                              \
    }                                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q6_k_split##SUF(                                    \
        const u8* W, long long nbt, const float* x, float* y, int rows, int cols, int rpb, float* part, unsigned* cnt, int nbs) { \
        mvq_q6_k<true, false, true, P, NT>(W, W, nbt, x, y, y, rows, cols, rpb, part, cnt, nbs);                               \
    }                                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256, MVQ_MIN_BLOCKS) mvq_q6_k_pair##SUF(                                     \
        const u8* W, const u8* W2, long long nbt, const float* x, float* y, float* y2, int rows, int cols, int rpb) {          \
        mvq_q6_k<true, true, false, P, NT>(W, W2, nbt, x, y, y2, rows, cols, rpb);                                             \
    }
MVQ_Q6_FEW(_n2, 3, 2)
MVQ_Q6_FEW(_p2_n2, 2, 2)
MVQ_Q6_FEW(_n3, 3, 3)
MVQ_Q6_FEW(_p2_n3, 2, 3)

// ==== The x-stationary kernels with their weights staged by the TMA (sm_90) ====
// The kernels above keep one step of MVQ_R rows in flight in registers: about 15 KB per block, two
// blocks per SM, which at the DRAM latency of a loaded H200 caps them near 2.6 TB/s (the FFN pair:
// 56 us for 150 MB). Here one thread hands the copy engine (cp.async.bulk) each step's rows, whole:
// `stages` steps of MVQ_R rows in shared memory, `stages - 1` of them in flight while the block
// computes one, with no registers held for them. Every thread reads from shared memory exactly
// the bytes it read from global memory before and does the same arithmetic in the same order: the
// same bits as the register kernels (gpu.rs checks it). A stage is refilled after the step's
// barrier in mvq_finish, which every thread reaches after its reads of that stage.
#define MVQ_TMA_MAX_STAGES 8

// The staged Q4_K kernel: the block's threads cover the launch's column range with 4 threads per
// 256-column block, thread j of a block taking its 32 code bytes 32j.. (64 weights: sub-blocks
// 2j and 2j + 1, the low and high nibbles), so each row's scales and mins are decoded once per 64
// weights rather than per 32, and its activations as four runs of 16 (digits, scale and sum as
// x_digits). The weights come through the TMA: `stages` stages of MVQ_R rows in shared memory,
// each row the launch's column range (nbl blocks of 144 B) as in the file; the stage stride is
// the host's, MVQ_R * nbs * 144 (nbs = nb without SPLIT). Nsight put the 8-thread form (as
// mvq_q4_k) at 60% of the SMs' issue rate at 2.66 TB/s: the products were bound by instructions
// (3.8 per weight, 2.2 here), not by loads in flight.
// Per row: sum over the thread's runs of (d sc) (q . X) 2^(E-B) - (dmin m) sum x, the integer dot
// products exact (as mvq_q4_k), combined in f32 in a fixed order; partial rows summed over the
// block in a fixed order (warp_sum4, then warps in order).
template <bool PAIR, bool SPLIT, int P, int NT = 1>
__device__ __forceinline__ void mvq_q4_k_tma(const u8* __restrict__ W, const u8* __restrict__ W2, const float* __restrict__ x,
                                             float* __restrict__ y, float* __restrict__ y2, int rows, int cols, int rpb,
                                             float* __restrict__ part, unsigned* cnt, int nbs, int stages) {
    extern __shared__ __align__(128) u8 stage_mem[];
    __shared__ float red[2][MVQ_MAX_THREADS / 32][NT * MVQ_R];
    __shared__ __align__(8) u64 bars[MVQ_TMA_MAX_STAGES];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const int nb = cols >> 8, b0 = tid >> 2, j = tid & 3;
    const int b_off = SPLIT ? blockIdx.y * nbs : 0;
    const int nbl = SPLIT ? min(nbs, nb - b_off) : nb;  // this launch's column blocks
    const bool on = b0 < nbl;
    const int bl = on ? b0 : 0, b = bl + b_off;
    const int vrows = PAIR ? 2 * rows : rows;
    const int r_begin = blockIdx.x * rpb, r_end = min(vrows, r_begin + rpb);
    const int steps = r_begin < r_end ? (r_end - r_begin + MVQ_R - 1) / MVQ_R : 0;
    const int rb = nbl * 144;                             // bytes of a row's range
    const int stride = MVQ_R * (SPLIT ? nbs : nb) * 144;  // bytes of a stage
    mbar_init_all(bars, stages);
    // Step k's rows (clamped to the last) into stage k % stages.
    auto issue = [&](int k) {
        const int s = k % stages;
        mbar_expect(&bars[s], (u32)(MVQ_R * rb));
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
            int row = min(r_begin + k * MVQ_R + r, vrows - 1);
            const u8* M = mvq_seg<PAIR>(W, W2, row, rows);
            tma_copy(stage_mem + s * stride + r * rb, M + ((long long)row * nb + b_off) * 144, (u32)rb, &bars[s]);
        }
    };
    // The first stages (the weights do not depend on x) in flight while x becomes digits, and,
    // launched programmatically, while the kernel before finishes.
    pdl_trigger();
    if (tid == 0)
        for (int k = 0; k < min(stages, steps); k++) issue(k);
    pdl_wait();
    // Runs u = 0..3: x[b 256 + 64 j + 16 u ..+16): the low nibbles of code bytes 0..15 (u = 0) and
    // 16..31 (u = 1) of the thread's 32, the high nibbles of the same (u = 2, 3).
    // Token t's (x + t cols), as a one-token launch makes them.
    u32 d0[NT][4][4], d1[NT][4][4], d2[NT][4][4];
    float xsc[NT][4], xsum_a[NT], xsum_b[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float sums[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float v[16];
            const float* xp = x + (long long)t * cols + b * 256 + 64 * j + 16 * u;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float4 a = ld_after_wait(xp + 4 * i);
                v[4 * i] = a.x; v[4 * i + 1] = a.y; v[4 * i + 2] = a.z; v[4 * i + 3] = a.w;
            }
            x_digits<16, P>(v, d0[t][u], d1[t][u], d2[t][u], xsc[t][u], sums[u]);
        }
        xsc[t][2] *= 0.0625f;  // the high nibbles' runs: codes taken as 16 q (q4_hi), exact
        xsc[t][3] *= 0.0625f;
        xsum_a[t] = sums[0] + sums[1];  // sub-block 2j
        xsum_b[t] = sums[2] + sums[3];  // sub-block 2j + 1
    }
    float* yp = SPLIT ? part + (long long)blockIdx.y * NT * rows : y;
    for (int k = 0; k < steps; k++) {
        const int s = k % stages, r0 = r_begin + k * MVQ_R;
        mbar_wait(&bars[s], (u32)((k / stages) & 1));
        const u8* st = stage_mem + s * stride + bl * 144;
        float acc[NT][MVQ_R];
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
            const uint4 hd = *(const uint4*)(st + r * rb);
            const uint4 qa = *(const uint4*)(st + r * rb + 16 + 32 * j);
            const uint4 qb = *(const uint4*)(st + r * rb + 32 + 32 * j);
            const float d = h2f((u16)(hd.x & 0xFFFF)), dm = h2f((u16)(hd.x >> 16));
            float sa, ma, sb, mb;
            scale_min_pair(j, hd.y, hd.z, hd.w, &sa, &ma, &sb, &mb);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float qx[4];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint4 qq = h ? qb : qa;
                    const u32 q[4] = {qq.x, qq.y, qq.z, qq.w};
                    // As mvq_q4_k.
                    q4_dots<P>(q, d0[t][h], d1[t][h], d2[t][h], d0[t][h + 2], d1[t][h + 2], d2[t][h + 2], xsc[t][h],
                               xsc[t][h + 2], qx[h], qx[h + 2]);
                }
                // w = d sc q - dmin m, over sub-blocks 2j (runs 0, 1) and 2j + 1 (runs 2, 3).
                acc[t][r] = on ? ((d * sa) * (qx[0] + qx[1]) - (dm * ma) * xsum_a[t]) + ((d * sb) * (qx[2] + qx[3]) - (dm * mb) * xsum_b[t])
                               : 0.0f;
            }
        }
        const int it = k & 1;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = warp_sum4(acc[t], lane);
            if ((lane & 7) == 0) red[it][warp][t * MVQ_R + (lane >> 3)] = v;
        }
        __syncthreads();  // every thread's reads of stage s are done: it may be refilled
        if (tid < NT * MVQ_R) {
            const int t = tid / MVQ_R, rr = r0 + tid - t * MVQ_R;
            float sum = 0.0f;
            for (int w = 0; w < nw; w++) sum += red[it][w][tid];
            if (PAIR && r0 >= rows) {
                if (rr < r_end) y2[(long long)t * rows + rr - rows] = sum;
            } else if (rr < (PAIR ? min(r_end, rows) : r_end)) {
                yp[(long long)t * rows + rr] = sum;
            }
        }
        if (tid == 0 && k + stages < steps) issue(k + stages);
    }
    if (SPLIT) mvq_split_sum<NT>(part, y, cnt, rows, r_begin, r_end);
}

// Bytes of a Q6_K row range of nbl blocks in a stage: ql, qh, scales, then d's 16-byte-aligned
// cover (the range's d start anywhere in a 16-byte word: 15 bytes before it at most, and the
// device buffer of a Q6_K matrix carries 16 bytes of padding past d, lib.rs matrix_from_bytes).
__device__ __forceinline__ int q6_stage_row(int nbl) { return nbl * 208 + ((2 * nbl + 15) & ~15) + 16; }

// The staged form of mvq_q6_k (PF), as mvq_q4_k_tma.
template <bool PAIR, bool SPLIT, int P, int NT = 1>
__device__ __forceinline__ void mvq_q6_k_tma(const u8* __restrict__ W, const u8* __restrict__ W2, long long nbt,
                                             const float* __restrict__ x, float* __restrict__ y, float* __restrict__ y2, int rows,
                                             int cols, int rpb, float* __restrict__ part, unsigned* cnt, int nbs, int stages) {
    extern __shared__ __align__(128) u8 stage_mem[];
    __shared__ float red[2][MVQ_MAX_THREADS / 32][NT * MVQ_R];
    __shared__ __align__(8) u64 bars[MVQ_TMA_MAX_STAGES];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const int nb = cols >> 8, b0 = tid >> 3, sub = tid & 7, n = sub >> 2, k8 = sub & 3;
    const int b_off = SPLIT ? blockIdx.y * nbs : 0;
    const int nbl = SPLIT ? min(nbs, nb - b_off) : nb;
    const bool on = b0 < nbl;
    const int bl = on ? b0 : 0, b = bl + b_off;
    const int vrows = PAIR ? 2 * rows : rows;
    const int r_begin = blockIdx.x * rpb, r_end = min(vrows, r_begin + rpb);
    const int steps = r_begin < r_end ? (r_end - r_begin + MVQ_R - 1) / MVQ_R : 0;
    const int rb = q6_stage_row(nbl);
    const int stride = MVQ_R * q6_stage_row(SPLIT ? nbs : nb);
    mbar_init_all(bars, stages);
    auto issue = [&](int k) {
        const int s = k % stages;
        u32 total = 0;
        long long blk[MVQ_R];
        const u8* Ms[MVQ_R];
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
            int row = min(r_begin + k * MVQ_R + r, vrows - 1);
            Ms[r] = mvq_seg<PAIR>(W, W2, row, rows);
            blk[r] = (long long)row * nb + b_off;
            const long long d0 = nbt * 208 + 2 * blk[r];
            total += nbl * 208 + (u32)(((d0 + 2 * nbl + 15) & ~15LL) - (d0 & ~15LL));
        }
        mbar_expect(&bars[s], total);
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
            u8* dst = stage_mem + s * stride + r * rb;
            const u8* M = Ms[r];
            tma_copy(dst, M + blk[r] * 128, (u32)(nbl * 128), &bars[s]);
            tma_copy(dst + nbl * 128, M + nbt * 128 + blk[r] * 64, (u32)(nbl * 64), &bars[s]);
            tma_copy(dst + nbl * 192, M + nbt * 192 + blk[r] * 16, (u32)(nbl * 16), &bars[s]);
            const long long d0 = nbt * 208 + 2 * blk[r], a0 = d0 & ~15LL;
            tma_copy(dst + nbl * 208, M + a0, (u32)(((d0 + 2 * nbl + 15) & ~15LL) - a0), &bars[s]);
        }
    };
    pdl_trigger();
    if (tid == 0)
        for (int k = 0; k < min(stages, steps); k++) issue(k);
    pdl_wait();
    u32 x0[NT][4][2], x1[NT][4][2], x2[NT][4][2];
    float xsc[NT][4];
    int xc[NT][3][4];
#pragma unroll
    for (int t = 0; t < NT; t++) q6_x_digits<P>(x + (long long)t * cols, b, n, k8, x0[t], x1[t], x2[t], xsc[t], xc[t]);
    float* yp = SPLIT ? part + (long long)blockIdx.y * NT * rows : y;
    for (int k = 0; k < steps; k++) {
        const int s = k % stages, r0 = r_begin + k * MVQ_R;
        mbar_wait(&bars[s], (u32)((k / stages) & 1));
        float acc[NT][MVQ_R];
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
            const u8* st = stage_mem + s * stride + r * rb;
            const int row = min(r0 + r, vrows - 1);
            const long long d0 = nbt * 208 + 2 * ((long long)(PAIR && row >= rows ? row - rows : row) * nb + b_off);
            const float dr = h2f(*(const u16*)(st + nbl * 208 + (int)(d0 & 15) + 2 * bl));
            const uint2 L0 = *(const uint2*)(st + bl * 128 + 64 * n + 8 * k8);
            const uint2 L1 = *(const uint2*)(st + bl * 128 + 64 * n + 32 + 8 * k8);
            const uint2 H = *(const uint2*)(st + nbl * 128 + bl * 64 + 32 * n + 8 * k8);
            const u32* s4 = (const u32*)(st + nbl * 192 + bl * 16 + 8 * n);
            const u32 w0 = s4[0], w1 = s4[1];
            const u32 scw = (k8 >> 1) ? __byte_perm(w0, w1, 0x7531) : __byte_perm(w0, w1, 0x6420);
            u32 qv[4][2];
            q6_codes(L0, L1, H, qv);
#pragma unroll
            for (int t = 0; t < NT; t++)
                acc[t][r] = on ? q6_dot_codes<P>(qv, scw, dr, x0[t], x1[t], x2[t], xsc[t], xc[t]) : 0.0f;
        }
        if (PAIR && r0 >= rows) mvq_finish<MVQ_R, false, NT>(acc, red, k & 1, y2, rows, r0 - rows, r_end - rows, tid, lane, warp, nw);
        else mvq_finish<MVQ_R, false, NT>(acc, red, k & 1, yp, rows, r0, PAIR ? min(r_end, rows) : r_end, tid, lane, warp, nw);
        if (tid == 0 && k + stages < steps) issue(k + stages);
    }
    if (SPLIT) mvq_split_sum<NT>(part, y, cnt, rows, r_begin, r_end);
}

// Entry points: one signature for every staged form (W2 = W, y2 = y, part and cnt unused without
// PAIR or SPLIT); Q6_K's with nbt after W2.
#define MVQ_TMA4(NAME, PAIR, SPLIT, P, NT)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) NAME(const u8* W, const u8* W2, const float* x, float* y, float* y2,     \
                                                           int rows, int cols, int rpb, float* part, unsigned* cnt, int nbs, \
                                                           int stages) {                                                     \
        mvq_q4_k_tma<PAIR, SPLIT, P, NT>(W, W2, x, y, y2, rows, cols, rpb, part, cnt, nbs, stages);                              \
    }
#define MVQ_TMA6(NAME, PAIR, SPLIT, P, NT)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) NAME(const u8* W, const u8* W2, long long nbt, const float* x, float* y, \
                                                           float* y2, int rows, int cols, int rpb, float* part, unsigned* cnt, \
                                                           int nbs, int stages) {                                            \
        mvq_q6_k_tma<PAIR, SPLIT, P, NT>(W, W2, nbt, x, y, y2, rows, cols, rpb, part, cnt, nbs, stages);                         \
    }
MVQ_TMA4(mvq_q4_k_tma, false, false, 3, 1)
MVQ_TMA4(mvq_q4_k_split_tma, false, true, 3, 1)
MVQ_TMA4(mvq_q4_k_pair_tma, true, false, 3, 1)
MVQ_TMA4(mvq_q4_k_tma_p2, false, false, 2, 1)
MVQ_TMA4(mvq_q4_k_split_tma_p2, false, true, 2, 1)
MVQ_TMA4(mvq_q4_k_pair_tma_p2, true, false, 2, 1)
MVQ_TMA6(mvq_q6_k_tma, false, false, 3, 1)
MVQ_TMA6(mvq_q6_k_split_tma, false, true, 3, 1)
MVQ_TMA6(mvq_q6_k_pair_tma, true, false, 3, 1)
MVQ_TMA6(mvq_q6_k_tma_p2, false, false, 2, 1)
MVQ_TMA6(mvq_q6_k_split_tma_p2, false, true, 2, 1)
MVQ_TMA6(mvq_q6_k_pair_tma_p2, true, false, 2, 1)
// The few-token forms: NT tokens of x (rows of cols values), y and y2 NT rows of rows values.
MVQ_TMA4(mvq_q4_k_tma_n2, false, false, 3, 2)
MVQ_TMA4(mvq_q4_k_tma_p2_n2, false, false, 2, 2)
MVQ_TMA4(mvq_q4_k_split_tma_n2, false, true, 3, 2)
MVQ_TMA4(mvq_q4_k_split_tma_p2_n2, false, true, 2, 2)
MVQ_TMA4(mvq_q4_k_pair_tma_n2, true, false, 3, 2)
MVQ_TMA4(mvq_q4_k_pair_tma_p2_n2, true, false, 2, 2)
MVQ_TMA6(mvq_q6_k_tma_n2, false, false, 3, 2)
MVQ_TMA6(mvq_q6_k_tma_p2_n2, false, false, 2, 2)
MVQ_TMA6(mvq_q6_k_split_tma_n2, false, true, 3, 2)
MVQ_TMA6(mvq_q6_k_split_tma_p2_n2, false, true, 2, 2)
MVQ_TMA6(mvq_q6_k_pair_tma_n2, true, false, 3, 2)
MVQ_TMA6(mvq_q6_k_pair_tma_p2_n2, true, false, 2, 2)
MVQ_TMA4(mvq_q4_k_tma_n3, false, false, 3, 3)
MVQ_TMA4(mvq_q4_k_tma_p2_n3, false, false, 2, 3)
MVQ_TMA4(mvq_q4_k_split_tma_n3, false, true, 3, 3)
MVQ_TMA4(mvq_q4_k_split_tma_p2_n3, false, true, 2, 3)
MVQ_TMA4(mvq_q4_k_pair_tma_n3, true, false, 3, 3)
MVQ_TMA4(mvq_q4_k_pair_tma_p2_n3, true, false, 2, 3)
MVQ_TMA6(mvq_q6_k_tma_n3, false, false, 3, 3)
MVQ_TMA6(mvq_q6_k_tma_p2_n3, false, false, 2, 3)
MVQ_TMA6(mvq_q6_k_split_tma_n3, false, true, 3, 3)
MVQ_TMA6(mvq_q6_k_split_tma_p2_n3, false, true, 2, 3)
MVQ_TMA6(mvq_q6_k_pair_tma_n3, true, false, 3, 3)
MVQ_TMA6(mvq_q6_k_pair_tma_p2_n3, true, false, 2, 3)
