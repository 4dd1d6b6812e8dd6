// --mode cuda-parity on the GPU: llama.cpp b11434's CUDA products of one token, the arithmetic of
// the CPU model crates/engine/src/cpu/cuda_anchor.rs operation for operation (every float
// operation written with an explicit rounding, so nvcc fuses nothing the model rounds twice, and
// the sums in the model's order): gpu.rs compares the two bit for bit. Weights in the device
// layout (matrix.rs: Q8_0, Q4_0 and Q6_K as per-field arrays, Q4_K/Q5_K/F16 as in the file).

// q8_1 activations of `ntok` rows of `cols` (a multiple of 32): one warp per block of 32, d =
// amax / 127, q = roundf(x / d), the scale and the butterfly sum of the floats kept as read from
// f16 (ggml-cuda quantize_q8_1).
extern "C" __global__ void pq_quantize(const float* __restrict__ x, int cols, int ntok, signed char* __restrict__ q, float* __restrict__ d, float* __restrict__ s) {
    const int lane = threadIdx.x & 31;
    const long long nblk = (long long)ntok * (cols / 32);
    const long long step = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long blk = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); blk < nblk; blk += step) {
        const float v = x[blk * 32 + lane];
        float amax = fabsf(v), sum = v;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
        }
        const float dd = __fdiv_rn(amax, 127.0f);
        q[blk * 32 + lane] = amax == 0.0f ? 0 : (signed char)roundf(__fdiv_rn(v, dd));
        if (lane == 0) {
            d[blk] = h2f(f2h(dd));
            s[blk] = h2f(f2h(sum));
        }
    }
}

// f16 fused multiply-add, one rounding (HFMA).
__device__ __forceinline__ u16 pq_hfma(u16 a, u16 b, u16 c) {
    u16 r;
    asm("fma.rn.f16 %0, %1, %2, %3;" : "=h"(r) : "h"(a), "h"(b), "h"(c));
    return r;
}

__device__ __forceinline__ int pq_int(const u8* p) {
    return (int)((u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24));
}
__device__ __forceinline__ float pq_half(const u8* p) {
    return h2f((u16)(p[0] | (p[1] << 8)));
}
// Q4_K/Q5_K 6-bit scale and min of sub-block j (formats.rs scale_min_k4).
__device__ __forceinline__ void pq_scale_min(int j, const u8* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// vec_dot of block kbx of row `row` (nb blocks per row, nbt in the matrix) with the q8_1 row
// (q, d, s), quant index iqs (cuda_anchor.rs vec_dot).
template <int FMT>
__device__ float pq_vec_dot(const u8* __restrict__ W, long long nbt, int row, int nb, int kbx, const signed char* __restrict__ q, const float* __restrict__ d, const float* __restrict__ s, int iqs) {
    const long long bi = (long long)row * nb + kbx;
    if (FMT == FMT_Q4_0) {
        const u8* qs = W + bi * 16;
        const float d4 = pq_half(W + nbt * 16 + bi * 2);
        int sumi = 0;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int v = pq_int(qs + 4 * (iqs + i));
            sumi = __dp4a(v & 0x0F0F0F0F, *(const int*)(q + 32 * kbx + 4 * (iqs + i)), sumi);
            sumi = __dp4a((v >> 4) & 0x0F0F0F0F, *(const int*)(q + 32 * kbx + 4 * (iqs + i + 4)), sumi);
        }
        return __fmul_rn(d4, __fsub_rn(__fmul_rn((float)sumi, d[kbx]), __fmul_rn(4.0f, s[kbx])));
    } else if (FMT == FMT_Q8_0) {
        const u8* qs = W + bi * 32;
        const float dw = pq_half(W + nbt * 32 + bi * 2);
        int sumi = 0;
#pragma unroll
        for (int i = 0; i < 2; i++) sumi = __dp4a(pq_int(qs + 4 * (iqs + i)), *(const int*)(q + 32 * kbx + 4 * (iqs + i)), sumi);
        return __fmul_rn(__fmul_rn(dw, d[kbx]), (float)sumi);
    } else if (FMT == FMT_Q4_K || FMT == FMT_Q5_K) {
        const int size = FMT == FMT_Q5_K ? 176 : 144;
        const u8* b = W + bi * size;
        const float dd = pq_half(b), dmin = pq_half(b + 2);
        const u8* scales = b + 4;
        const u8* qh = b + 16;
        const u8* qs = FMT == FMT_Q5_K ? b + 48 : b + 16;
        const int bq8 = 2 * ((iqs / 2) / 4), t = (iqs / 2) % 4;
        float sumf_d = 0.0f, sumf_m = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int sub = bq8 + i;
            int sc, m;
            pq_scale_min(sub, scales, sc, m);
            int v[2];
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const u32 ql = (u32)pq_int(qs + 16 * bq8 + 4 * t + 16 * k);
                const u32 vh = FMT == FMT_Q5_K ? ((u32)pq_int(qh + 4 * t + 16 * k) >> bq8) : 0u;
                v[k] = (int)(((ql >> (4 * i)) & 0x0F0F0F0Fu) | (((vh >> i) << 4) & 0x10101010u));
            }
            const signed char* qb = q + 256 * kbx + 32 * sub;
            const int u0 = *(const int*)(qb + 4 * t), u1 = *(const int*)(qb + 16 + 4 * t);
            const int dot1 = __dp4a(v[1], u1, __dp4a(v[0], u0, 0));
            const int dot2 = __dp4a(0x01010101, u1, __dp4a(0x01010101, u0, 0));
            const float d8 = d[8 * kbx + sub];
            sumf_d = __fadd_rn(sumf_d, __fmul_rn(d8, (float)(dot1 * sc)));
            sumf_m = __fadd_rn(sumf_m, __fmul_rn(d8, (float)(dot2 * m)));
        }
        return __fsub_rn(__fmul_rn(dd, sumf_d), __fmul_rn(dmin, sumf_m));
    } else {  // Q6_K: ql, qh, scales, d arrays
        const u8* ql = W + bi * 128;
        const u8* qh = W + nbt * 128 + bi * 64;
        const signed char* sc = (const signed char*)(W + nbt * 192 + bi * 16);
        const float dd = pq_half(W + nbt * 208 + bi * 2);
        const int bq8 = 4 * (iqs / 16) + (iqs % 16) / 8;
        const int so = 8 * (iqs / 16) + (iqs % 16) / 4;
        const int vh_shift = 2 * ((iqs % 16) / 8);
        const u32 vl = (u32)pq_int(ql + 4 * iqs);
        const u32 vh = (u32)pq_int(qh + 4 * (8 * (iqs / 16) + iqs % 8)) >> vh_shift;
        float sumf = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const u32 vil = (vl >> (4 * i)) & 0x0F0F0F0Fu;
            const u32 vih = ((vh >> (4 * i)) << 4) & 0x30303030u;
            const int vi = (int)__vsub4(vil | vih, 0x20202020u);
            const int blk = 8 * kbx + bq8 + 2 * i;
            const int u = *(const int*)(q + 32 * blk + 4 * (iqs % 8));
            sumf = __fadd_rn(sumf, __fmul_rn(d[blk], (float)(__dp4a(vi, u, 0) * (int)sc[so + 4 * i])));
        }
        return __fmul_rn(dd, sumf);
    }
}

// One row per block of 128 threads (mul_mat_vec_q: per-thread sums in block order, warps 1..3
// added to warp 0 lane by lane in order, then the butterfly). Token t of the batch: grid.y.
template <int FMT, int QI, int VDR, int QK>
__device__ void pq_mmvq(const u8* __restrict__ W, long long nbt, int rows, int cols, const signed char* __restrict__ q, const float* __restrict__ d, const float* __restrict__ s, float* __restrict__ y) {
    __shared__ float part[128];
    const int row = blockIdx.x, tok = blockIdx.y, tid = threadIdx.x;
    const int nb = cols / QK, per_block = QI / VDR, per_iter = VDR * 128 / QI;
    const signed char* qt = q + (long long)tok * cols;
    const float* dt = d + (long long)tok * (cols / 32);
    const float* st = s + (long long)tok * (cols / 32);
    float tmp = 0.0f;
    for (int kbx = tid / per_block; kbx < nb; kbx += per_iter)
        tmp = __fadd_rn(tmp, pq_vec_dot<FMT>(W, nbt, row, nb, kbx, qt, dt, st, VDR * (tid % per_block)));
    part[tid] = tmp;
    __syncthreads();
    if (tid >= 32) return;
    float v = part[tid];
#pragma unroll
    for (int w = 1; w < 4; w++) v = __fadd_rn(v, part[32 * w + tid]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (tid == 0) y[(long long)tok * rows + row] = v;
}

extern "C" __global__ void pq_mmvq_q4_0(const u8* W, long long nbt, int rows, int cols, const signed char* q, const float* d, const float* s, float* y) { pq_mmvq<FMT_Q4_0, 4, 2, 32>(W, nbt, rows, cols, q, d, s, y); }
extern "C" __global__ void pq_mmvq_q8_0(const u8* W, long long nbt, int rows, int cols, const signed char* q, const float* d, const float* s, float* y) { pq_mmvq<FMT_Q8_0, 8, 2, 32>(W, nbt, rows, cols, q, d, s, y); }
extern "C" __global__ void pq_mmvq_q4_k(const u8* W, long long nbt, int rows, int cols, const signed char* q, const float* d, const float* s, float* y) { pq_mmvq<FMT_Q4_K, 32, 2, 256>(W, nbt, rows, cols, q, d, s, y); }
extern "C" __global__ void pq_mmvq_q5_k(const u8* W, long long nbt, int rows, int cols, const signed char* q, const float* d, const float* s, float* y) { pq_mmvq<FMT_Q5_K, 32, 2, 256>(W, nbt, rows, cols, q, d, s, y); }
extern "C" __global__ void pq_mmvq_q6_k(const u8* W, long long nbt, int rows, int cols, const signed char* q, const float* d, const float* s, float* y) { pq_mmvq<FMT_Q6_K, 32, 1, 256>(W, nbt, rows, cols, q, d, s, y); }

// F16 weights (mul_mat_vec_f with half2 sums): one row per block of `blockDim.x` threads (the
// host's mmvf block size), thread tid sums the pairs tid, tid + bs, ... in f16 (one rounding per
// fused multiply-add, the activations rounded to f16), the halves added in f32, then the warp
// butterfly and, with more than one warp, the butterfly of the warps' sums (missing ones 0).
extern "C" __global__ void pq_mmvf_f16(const u16* __restrict__ W, int rows, int cols, const float* __restrict__ x, float* __restrict__ y) {
    __shared__ float warps[32];
    const int row = blockIdx.x, tok = blockIdx.y, tid = threadIdx.x, bs = blockDim.x;
    const u16* wr = W + (long long)row * cols;
    const float* xt = x + (long long)tok * cols;
    u16 lo = 0, hi = 0;  // +0 in f16
    for (int c2 = tid; c2 < cols / 2; c2 += bs) {
        lo = pq_hfma(wr[2 * c2], f2h(xt[2 * c2]), lo);
        hi = pq_hfma(wr[2 * c2 + 1], f2h(xt[2 * c2 + 1]), hi);
    }
    float v = __fadd_rn(h2f(lo), h2f(hi));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (bs > 32) {
        if ((tid & 31) == 0) warps[tid >> 5] = v;
        __syncthreads();
        if (tid >= 32) return;
        v = tid < (bs >> 5) ? warps[tid] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    if (tid == 0) y[(long long)tok * rows + row] = v;
}
