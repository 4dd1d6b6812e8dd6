// Elementwise operations in f64, rounded once (as cpu/ops.rs).

// x *= sigmoid(g)
extern "C" __global__ void sigmoid_gate(float* x, const float* g, long long n, int cols, float* xs) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        x[i] = (float)((double)x[i] / (1.0 + exp(-(double)g[i])));
    }
}

// out = silu(g) * u
extern "C" __global__ void swiglu(const float* g, const float* u, float* out, long long n) {
    pdl_trigger();  // the FFN's down projection may start loading its weights
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        double gv = g[i];
        out[i] = (float)__dmul_rn(gv / (1.0 + exp(-gv)), (double)u[i]);
    }
}

// x = cap * tanh(x * scale / cap), or x * scale when cap == 0.
extern "C" __global__ void logit_finish(float* x, long long n, float scale, float cap) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        if (cap != 0.0f) {
            double c = cap;
            x[i] = (float)__dmul_rn(c, tanh(__dmul_rn((double)x[i], (double)scale) / c));
        } else {
            x[i] = (float)__dmul_rn((double)x[i], (double)scale);
        }
    }
}

// Sums of 8 consecutive values of every row (when the producer did not write them).
extern "C" __global__ void sums8(const float* x, long long n8, float* xs) {
    for (long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x; c < n8; c += (long long)gridDim.x * blockDim.x) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) s = __fadd_rn(s, x[8 * c + i]);
        xs[c] = s;
    }
}

// out[i] = x[rows[i]] (rows on the device).
extern "C" __global__ void select_rows(const float* x, const u32* rows, int cols, float* out) {
    long long src = (long long)rows[blockIdx.y] * cols, dst = (long long)blockIdx.y * cols;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) out[dst + c] = x[src + c];
}

// Greedy selection on the device: the index of each row's largest value (lowest among ties;
// NaN never wins). grid (chunks, rows), 1024 threads: each block finds its chunk's best into
// part (value, index); the last block of a row to finish (a counter per row, reset by it) takes
// the best of the chunks. Largest-then-lowest-index is associative, so any grouping gives the
// same answer.
__device__ __forceinline__ void amax_pick(float& best, int& idx, float v, int i) {
    if (v > best || (v == best && i < idx)) { best = v; idx = i; }
}
__device__ __forceinline__ void amax_block(float& best, int& idx) {
    __shared__ float bv[32];
    __shared__ int bi[32];
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        amax_pick(best, idx, ov, oi);
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) { bv[w] = best; bi[w] = idx; }
    __syncthreads();
    int nw = blockDim.x >> 5;
    best = lane < nw ? bv[lane] : -__int_as_float(0x7f800000);
    idx = lane < nw ? bi[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        amax_pick(best, idx, ov, oi);
    }
}
extern "C" __global__ void argmax_rows(const float* x, int cols, u32* out, float* pv, int* pi, unsigned* cnt) {
    __shared__ bool last;
    const float* r = x + (long long)blockIdx.y * cols;
    const int per = (cols + gridDim.x - 1) / gridDim.x;
    const int c0 = blockIdx.x * per, c1 = min(cols, c0 + per);
    float best = -__int_as_float(0x7f800000);
    int idx = 0x7fffffff;
    for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x) amax_pick(best, idx, r[c], c);
    amax_block(best, idx);
    if (gridDim.x == 1) {
        if (threadIdx.x == 0) out[blockIdx.y] = (u32)idx;
        return;
    }
    const long long slot = (long long)blockIdx.y * gridDim.x + blockIdx.x;
    if (threadIdx.x == 0) {
        pv[slot] = best;
        pi[slot] = idx;
        __threadfence();
        last = atomicAdd(&cnt[blockIdx.y], 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    best = -__int_as_float(0x7f800000);
    idx = 0x7fffffff;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) {
        const long long k = (long long)blockIdx.y * gridDim.x + b;
        amax_pick(best, idx, __ldcg(pv + k), __ldcg(pi + k));
    }
    amax_block(best, idx);
    if (threadIdx.x == 0) {
        out[blockIdx.y] = (u32)idx;
        cnt[blockIdx.y] = 0u;
    }
}
