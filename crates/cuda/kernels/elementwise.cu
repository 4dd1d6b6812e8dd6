// Elementwise operations in f64, rounded once (as cpu/ops.rs).

// x *= sigmoid(g)
extern "C" __global__ void sigmoid_gate(float* x, const float* g, long long n, int cols, float* xs) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        x[i] = (float)((double)x[i] / (1.0 + exp(-(double)g[i])));
    }
}

// out = silu(g) * u
extern "C" __global__ void swiglu(const float* g, const float* u, float* out, long long n) {
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

// Greedy selection on the device: the index of each row's largest value (lowest among ties).
extern "C" __global__ void argmax_rows(const float* x, int cols, u32* out) {
    __shared__ float bv[32];
    __shared__ int bi[32];
    const float* r = x + (long long)blockIdx.x * cols;
    float best = -__int_as_float(0x7f800000);
    int idx = 0x7fffffff;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = r[c];
        if (v > best || (v == best && c < idx)) { best = v; idx = c; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) { bv[w] = best; bi[w] = idx; }
    __syncthreads();
    if (w == 0) {
        int nw = blockDim.x >> 5;
        best = lane < nw ? bv[lane] : -__int_as_float(0x7f800000);
        idx = lane < nw ? bi[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
        }
        if (lane == 0) out[blockIdx.x] = (u32)idx;
    }
}
