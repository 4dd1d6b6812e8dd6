// Matrix-vector variants for Q4_K at one token, timed side by side by mvbench.py (not part of
// the engine; the chosen design moves to crates/cuda/kernels/matvec.cu).

// ---- T: x-stationary, template rows per step R, optional prefetch of the next step ----
template <int R, bool PF>
__device__ __forceinline__ void t_load(const u8* __restrict__ W, int r0, int rows, int nb, int b, int sub, uint4 (&hd)[R], uint4 (&qq)[R]) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        const u8* blk = W + ((long long)min(r0 + r, rows - 1) * nb + b) * 144;
        hd[r] = __ldg((const uint4*)blk);
        qq[r] = __ldg((const uint4*)(blk + 16 + 16 * sub));
    }
}

template <int R, bool PF>
__device__ __forceinline__ void t_q4k(const u8* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows, int cols, int rpb) {
    __shared__ float red[2][20][R];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const int nb = cols >> 8, b0 = tid >> 3, sub = tid & 7, j = sub >> 1, half = sub & 1;
    const bool on = b0 < nb;
    const int b = on ? b0 : 0;
    const int e_lo = b * 256 + 64 * j + 16 * half, e_hi = e_lo + 32;
    float xl[16], xh[16];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float4 a = __ldg((const float4*)(x + e_lo) + i), c = __ldg((const float4*)(x + e_hi) + i);
        xl[4 * i] = a.x; xl[4 * i + 1] = a.y; xl[4 * i + 2] = a.z; xl[4 * i + 3] = a.w;
        xh[4 * i] = c.x; xh[4 * i + 1] = c.y; xh[4 * i + 2] = c.z; xh[4 * i + 3] = c.w;
    }
    float sl = 0.0f, sh = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; i++) { sl += xl[i]; sh += xh[i]; }
    const int r_begin = blockIdx.x * rpb, r_end = min(rows, r_begin + rpb);
    uint4 hd[R], qq[R], nhd[R], nqq[R];
    if (PF && r_begin < r_end) t_load<R, PF>(W, r_begin, rows, nb, b, sub, nhd, nqq);
    int it = 0;
    for (int r0 = r_begin; r0 < r_end; r0 += R, it ^= 1) {
        if (PF) {
#pragma unroll
            for (int r = 0; r < R; r++) { hd[r] = nhd[r]; qq[r] = nqq[r]; }
            if (r0 + R < r_end) t_load<R, PF>(W, r0 + R, rows, nb, b, sub, nhd, nqq);
        } else {
            t_load<R, PF>(W, r0, rows, nb, b, sub, hd, qq);
        }
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            float d = h2f((u16)(hd[r].x & 0xFFFF)), dm = h2f((u16)(hd[r].x >> 16));
            float sa, ma, sb, mb;
            scale_min_pair(j, hd[r].y, hd[r].z, hd[r].w, &sa, &ma, &sb, &mb);
            const float d1 = 16.0f * (d * sa), c1 = d1 + dm * ma;
            const float d2 = 16.0f * (d * sb), c2 = d2 + dm * mb;
            u32 q[4] = {qq[r].x, qq[r].y, qq[r].z, qq[r].w};
            float slo = 0.0f, shi = 0.0f;
#pragma unroll
            for (int w = 0; w < 4; w++) {
                u32 lo = ((q[w] << 3) & 0x78787878u) | 0x80808080u;
                u32 hi = ((q[w] >> 1) & 0x78787878u) | 0x80808080u;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    slo = fmaf(qf_byte(lo, k), xl[4 * w + k], slo);
                    shi = fmaf(qf_byte(hi, k), xh[4 * w + k], shi);
                }
            }
            acc[r] = on ? (d1 * slo - c1 * sl) + (d2 * shi - c2 * sh) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v = warp_sum(acc[r]);
            if (lane == 0) red[it][warp][r] = v;
        }
        __syncthreads();
        if (tid < R && r0 + tid < r_end) {
            float s = 0.0f;
            for (int w = 0; w < nw; w++) s += red[it][w][tid];
            y[r0 + tid] = s;
        }
    }
}
extern "C" __global__ void __launch_bounds__(640) t4(const u8* W, const float* x, float* y, int rows, int cols, int rpb) { t_q4k<4, false>(W, x, y, rows, cols, rpb); }
extern "C" __global__ void __launch_bounds__(640) t8(const u8* W, const float* x, float* y, int rows, int cols, int rpb) { t_q4k<8, false>(W, x, y, rows, cols, rpb); }
extern "C" __global__ void __launch_bounds__(640) t4p(const u8* W, const float* x, float* y, int rows, int cols, int rpb) { t_q4k<4, true>(W, x, y, rows, cols, rpb); }
extern "C" __global__ void __launch_bounds__(256) t4p_s(const u8* W, const float* x, float* y, int rows, int cols, int rpb) { t_q4k<4, true>(W, x, y, rows, cols, rpb); }
extern "C" __global__ void __launch_bounds__(256) t8_s(const u8* W, const float* x, float* y, int rows, int cols, int rpb) { t_q4k<8, false>(W, x, y, rows, cols, rpb); }
extern "C" __global__ void __launch_bounds__(256) t8p_s(const u8* W, const float* x, float* y, int rows, int cols, int rpb) { t_q4k<8, true>(W, x, y, rows, cols, rpb); }

// ---- S: x staged in shared memory (4-float pad per 64: conflict-free for this lane map, with the
// sums of 16 beside it), 8 warps per block, each warp RW rows at a time over all columns ----
__device__ __forceinline__ int spad(int e) { return e + ((e >> 6) << 2); }

template <int RW, int UNR>
__device__ __forceinline__ void s_q4k(const u8* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int rows, int cols, int rpb) {
    extern __shared__ float smem[];
    float* xsm = smem;                        // spad(cols) floats
    float* x16 = smem + spad(cols);           // cols / 16 sums
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarp = blockDim.x >> 5;
    for (int e4 = tid; e4 < cols / 4; e4 += blockDim.x) {
        float4 v = __ldg((const float4*)x + e4);
        *(float4*)(xsm + spad(4 * e4)) = v;
    }
    __syncthreads();
    for (int c = tid; c < cols / 16; c += blockDim.x) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) s += xsm[spad(16 * c + i)];
        x16[c] = s;
    }
    __syncthreads();
    const int nb = cols >> 8, g = lane >> 3, sub = lane & 7, j = sub >> 1, half = sub & 1;
    const int r_begin = blockIdx.x * rpb, r_end = min(rows, r_begin + rpb);
    for (int r0 = r_begin + warp * RW; r0 < r_end; r0 += nwarp * RW) {
        float acc[RW];
#pragma unroll
        for (int r = 0; r < RW; r++) acc[r] = 0.0f;
#pragma unroll UNR
        for (int b = g; b < nb; b += 4) {
            uint4 hd[RW], qq[RW];
#pragma unroll
            for (int r = 0; r < RW; r++) {
                const u8* blk = W + ((long long)min(r0 + r, rows - 1) * nb + b) * 144;
                hd[r] = __ldg((const uint4*)blk);
                qq[r] = __ldg((const uint4*)(blk + 16 + 16 * sub));
            }
            const int e_lo = b * 256 + 64 * j + 16 * half, e_hi = e_lo + 32;
            const float sl = x16[e_lo >> 4], sh = x16[e_hi >> 4];
            float slo[RW], shi[RW];
#pragma unroll
            for (int r = 0; r < RW; r++) { slo[r] = 0.0f; shi[r] = 0.0f; }
#pragma unroll
            for (int w = 0; w < 4; w++) {
                float4 a = *(const float4*)(xsm + spad(e_lo + 4 * w));
                float4 c = *(const float4*)(xsm + spad(e_hi + 4 * w));
                float xa[4] = {a.x, a.y, a.z, a.w}, xc[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
                for (int r = 0; r < RW; r++) {
                    u32 v = (w == 0 ? qq[r].x : w == 1 ? qq[r].y : w == 2 ? qq[r].z : qq[r].w);
                    u32 lo = ((v << 3) & 0x78787878u) | 0x80808080u;
                    u32 hi = ((v >> 1) & 0x78787878u) | 0x80808080u;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        slo[r] = fmaf(qf_byte(lo, k), xa[k], slo[r]);
                        shi[r] = fmaf(qf_byte(hi, k), xc[k], shi[r]);
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < RW; r++) {
                float d = h2f((u16)(hd[r].x & 0xFFFF)), dm = h2f((u16)(hd[r].x >> 16));
                float sa, ma, sb, mb;
                scale_min_pair(j, hd[r].y, hd[r].z, hd[r].w, &sa, &ma, &sb, &mb);
                const float d1 = 16.0f * (d * sa), c1 = d1 + dm * ma;
                const float d2 = 16.0f * (d * sb), c2 = d2 + dm * mb;
                acc[r] += (d1 * slo[r] - c1 * sl) + (d2 * shi[r] - c2 * sh);
            }
        }
#pragma unroll
        for (int r = 0; r < RW; r++) {
            float v = warp_sum(acc[r]);
            if (lane == 0 && r0 + r < r_end) y[r0 + r] = v;
        }
    }
}
extern "C" __global__ void __launch_bounds__(256) s1(const u8* W, const float* x, float* y, int rows, int cols, int rpb) { s_q4k<1, 4>(W, x, y, rows, cols, rpb); }
extern "C" __global__ void __launch_bounds__(256) s2(const u8* W, const float* x, float* y, int rows, int cols, int rpb) { s_q4k<2, 2>(W, x, y, rows, cols, rpb); }
extern "C" __global__ void __launch_bounds__(256) s4(const u8* W, const float* x, float* y, int rows, int cols, int rpb) { s_q4k<4, 1>(W, x, y, rows, cols, rpb); }
extern "C" __global__ void __launch_bounds__(256) s2u4(const u8* W, const float* x, float* y, int rows, int cols, int rpb) { s_q4k<2, 4>(W, x, y, rows, cols, rpb); }

// The integer (dp4a) x-stationary design that won is the engine's own now: mvq_q4_k and
// mvq_q4_k_wide in crates/cuda/kernels/matvec.cu, which mvbench.py times beside these.
