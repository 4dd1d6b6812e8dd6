// RMSNorm family, f64 reductions and f64 products rounded once to f32: the same arithmetic as
// the CPU backend's accurate mode (cpu/ops.rs), so the two agree to the last bit almost always.

__device__ __forceinline__ double block_sum_d(double v, double* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double t = lane < nw ? sh[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

// 1 / sqrt(sum / n + eps) of a block's f64 sum (block_sum_d's order and arithmetic), computed
// once by thread 0 and shared: the f64 division and square root in every thread cost about half a
// microsecond of one SM's f64 units at 1024 threads.
__device__ __forceinline__ double block_rms_scale(double v, int n, double eps, double* sh) {
    __shared__ double scale;
    const double t = block_sum_d(v, sh);
    if (threadIdx.x == 0) scale = 1.0 / sqrt(t / n + eps);
    __syncthreads();
    return scale;
}

// Sums of 8 consecutive values of a row, for the matrix-vector kernels (xs[row][n/8]).
__device__ __forceinline__ void row_sums8(const float* y, float* xs, int n) {
    __syncthreads();
    for (int c = threadIdx.x; c < n / 8; c += blockDim.x) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) s = __fadd_rn(s, y[8 * c + i]);
        xs[c] = s;
    }
}

// Row kernels keep their values in registers: NPT values per thread, 1024 threads (launch them
// with exactly 1024: NORM_THREADS in lib.rs), so a row of up to 8192 values is read from memory once, with all loads in flight together (a loop that
// waits on each load costs ~0.5 us per step on one SM).
#define NPT 8

// y = x * (1/sqrt(mean(x^2) + eps)) (* w), one block per row. `xs` (optional) receives sums of 8.
extern "C" __global__ void __launch_bounds__(1024) rms_norm(const float* x, const float* w, float eps, int n, float* y, float* xs) {
    __shared__ double sh[32];
    pdl_trigger();  // the product that reads y may start loading its weights
    pdl_wait();  // launched programmatically (lib.rs launch_small): nothing read or written before
    const float* xr = x + (long long)blockIdx.x * n;
    float* yr = y + (long long)blockIdx.x * n;
    float v[NPT], wv[NPT];
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < NPT; k++) {
        int i = threadIdx.x + k * 1024;
        v[k] = i < n ? xr[i] : 0.0f;
        wv[k] = (w && i < n) ? w[i] : 1.0f;
    }
#pragma unroll
    for (int k = 0; k < NPT; k++) ss += (double)v[k] * (double)v[k];
    ss = block_sum_d(ss, sh);
    double scale = 1.0 / sqrt(ss / n + (double)eps);
#pragma unroll
    for (int k = 0; k < NPT; k++) {
        int i = threadIdx.x + k * 1024;
        if (i < n) {
            double t = __dmul_rn((double)v[k], scale);
            yr[i] = (float)(w ? __dmul_rn(t, (double)wv[k]) : t);
        }
    }
    if (xs) row_sums8(yr, xs + (long long)blockIdx.x * (n / 8), n);
}

// The sandwich tail of a row: resid += rms_norm(src, eps1) * w1 (the post norm and its
// residual add), then y = rms_norm(resid, eps2) * w2 (the next pre norm). Two reductions, two
// epsilons: the composition of rms_norm, an f32 add and rms_norm, in one pass. The thread holds
// values i0 + k T (k < K) of row `row`; scale_of(sum, eps, slot) turns the thread's f64 sum of
// squares into 1 / sqrt(sum / n + eps) over the row (slot 0, then 1): over the block
// (block_rms_scale) or over a cluster of blocks (cluster_rms_scale).
template <int T, int K, typename Scale>
__device__ __forceinline__ void norm_tail_t(float* resid, const float* src, const float* w1, float eps1, const float* w2,
                                            float eps2, int n, float* y, float* xs, long long row, int i0,
                                            Scale scale_of) {
    pdl_trigger();  // the product that reads y may start loading its weights
    const long long off = row * n;
    const float* s = src + off;
    float* r = resid + off;
    float sv[K], rv[K], a1[K], a2[K];
    double ss = 0.0;
    // Every load first (the weights too), so their latencies overlap instead of following the
    // reductions. The weights (no kernel writes them) load before the wait, while the kernel
    // before finishes.
#pragma unroll
    for (int k = 0; k < K; k++) {
        int i = i0 + k * T;
        a1[k] = i < n ? w1[i] : 0.0f;
        a2[k] = i < n ? w2[i] : 0.0f;
    }
    pdl_wait();  // launched programmatically (lib.rs launch_small): nothing else read or written before
#pragma unroll
    for (int k = 0; k < K; k++) {
        int i = i0 + k * T;
        sv[k] = i < n ? s[i] : 0.0f;
        rv[k] = i < n ? r[i] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < K; k++) ss += (double)sv[k] * (double)sv[k];
    const double sc1 = scale_of(ss, (double)eps1, 0);
    double ss2 = 0.0;
#pragma unroll
    for (int k = 0; k < K; k++) {
        int i = i0 + k * T;
        if (i < n) {
            float t = (float)__dmul_rn(__dmul_rn((double)sv[k], sc1), (double)a1[k]);
            rv[k] = __fadd_rn(rv[k], t);
            r[i] = rv[k];
            ss2 += (double)rv[k] * (double)rv[k];
        }
    }
    const double sc2 = scale_of(ss2, (double)eps2, 1);
#pragma unroll
    for (int k = 0; k < K; k++) {
        int i = i0 + k * T;
        if (i < n) y[off + i] = (float)__dmul_rn(__dmul_rn((double)rv[k], sc2), (double)a2[k]);
    }
    if (xs) row_sums8(y + off, xs + row * (n / 8), n);
}

// The tail, one block of T threads per row, each thread 8192 / T values (rows of up to 8192):
// at 512 threads (the default, lib.rs norm_tail_kernel: 123 registers, no spills) and at 1024
// (NORM_THREADS, for measuring with `MUSER_NORM_TAIL_THREADS=1024`: ptxas holds it to 64
// registers and it spills 52 bytes a thread; before 2026-11-30 the only one). The same arithmetic
// per value; the f64 sums of squares partitioned over the threads (exact products, f64 sums: the
// f32 results agreed on every fixture, H200 call 5 of 2026-11-30). Decode on the H200:
// 147.15/147.54 tokens/s at 512 against 146.32/146.00 at 1024 and 144.09/144.27 at 256 (a form
// since removed: 203 registers), alternating in one call.
#define NORM_TAIL(NAME, T)                                                                                               \
    extern "C" __global__ void __launch_bounds__(T) NAME(float* resid, const float* src, const float* w1, float eps1,    \
                                                         const float* w2, float eps2, int n, float* y, float* xs) {      \
        __shared__ double sh[32];                                                                                        \
        norm_tail_t<T, 8192 / T>(resid, src, w1, eps1, w2, eps2, n, y, xs, blockIdx.x, (int)threadIdx.x,               \
                                 [&](double v, double eps, int) { return block_rms_scale(v, n, eps, sh); });             \
    }
NORM_TAIL(norm_tail_512, 512)
NORM_TAIL(norm_tail_1024, 1024)

// The tail over a cluster of C blocks of 1024 / C threads per row (sm_90; lib.rs, one token's
// rows without sums of 8): a row's f64 work and loads spread over C SMs instead of one. Block c of
// the cluster holds values c 8192 / C + t + (1024 / C) k (k < 8: rows of up to 8192), and the sums
// of squares are each block's (its threads' values in order, then block_sum_d), added in block
// order through distributed shared memory: a fixed order. Per value, norm_tail_t's arithmetic.
// C = 16 (`norm_tail_cluster16`, a non-portable cluster size) is the default on sm_90, C = 8
// (`norm_tail_cluster`) elsewhere. H200: 8 against one block a row, decode 150.26/150.29
// tokens/s against 147.88/147.86 (2026-11-30, twelfth session); 16 against 8, 153.52/153.48
// against 152.32/152.42, and 4 (removed after) 149.75/149.09 (2026-12-01, thirteenth session),
// alternating in one call.
__device__ __forceinline__ u32 cluster_rank() {
    u32 r = 0;
#if __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    return r;
}
// Every thread of the cluster: its shared-memory writes before this, visible to the cluster after.
__device__ __forceinline__ void cluster_sync_all() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
#endif
}
// `local`'s counterpart in block `rank` of the cluster.
__device__ __forceinline__ double cluster_ld_f64(const double* local, u32 rank) {
    double v = 0.0;
#if __CUDA_ARCH__ >= 900
    u32 ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(smem_addr(local)), "r"(rank));
    asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(ra) : "memory");
#endif
    return v;
}
// 1 / sqrt(sum / n + eps) of the cluster's sums in slot `slot` of `part` (thread 0 adds them in
// block order and shares the scale through `scale`).
template <int C>
__device__ __forceinline__ double cluster_rms_scale(double v, int n, double eps, double* sh, double* part, int slot,
                                                    double* scale) {
    const double t = block_sum_d(v, sh);
    if (threadIdx.x == 0) part[slot] = t;
    cluster_sync_all();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int q = 0; q < C; q++) s += cluster_ld_f64(&part[slot], (u32)q);
        *scale = 1.0 / sqrt(s / n + eps);
    }
    __syncthreads();
    return *scale;
}
template <int C>
__device__ __forceinline__ void norm_tail_cluster_t(float* resid, const float* src, const float* w1, float eps1,
                                                    const float* w2, float eps2, int n, float* y) {
    constexpr int T = 1024 / C;
    __shared__ double sh[32];
    __shared__ double part[2];
    __shared__ double scale;
    norm_tail_t<T, 8>(resid, src, w1, eps1, w2, eps2, n, y, nullptr, blockIdx.y, (int)cluster_rank() * (8192 / C) + (int)threadIdx.x,
                      [&](double v, double eps, int slot) { return cluster_rms_scale<C>(v, n, eps, sh, part, slot, &scale); });
    cluster_sync_all();  // no block leaves while another may still read its part
}
// norm_tail's parameters; `xs` is always null (the host takes these forms only where no sums of 8
// are wanted).
#define NORM_TAIL_CLUSTER(NAME, C)                                                                                          \
    extern "C" __global__ void __launch_bounds__(1024 / C) NAME(float* resid, const float* src, const float* w1, float eps1, \
                                                                const float* w2, float eps2, int n, float* y, float* xs) {  \
        norm_tail_cluster_t<C>(resid, src, w1, eps1, w2, eps2, n, y);                                                       \
    }
NORM_TAIL_CLUSTER(norm_tail_cluster, 8)
NORM_TAIL_CLUSTER(norm_tail_cluster16, 16)

// resid += rms_norm(src, eps) * w (a post norm without the next pre norm).
extern "C" __global__ void post_norm_add(float* resid, const float* src, const float* w, float eps, int n) {
    __shared__ double sh[32];
    long long off = (long long)blockIdx.x * n;
    double ss = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)src[off + i] * (double)src[off + i];
    ss = block_sum_d(ss, sh);
    double sc = 1.0 / sqrt(ss / n + (double)eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float t = (float)__dmul_rn(__dmul_rn((double)src[off + i], sc), (double)w[i]);
        resid[off + i] = __fadd_rn(resid[off + i], t);
    }
}

// Per-head RMSNorm times a constant, in place: one warp per head (grid: rows x heads).
extern "C" __global__ void head_norm(float* x, int n_heads, int head_dim, float eps, float scale) {
    int lane = threadIdx.x & 31;
    int head = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (head >= n_heads) return;
    float* h = x + ((long long)blockIdx.y * n_heads + head) * head_dim;
    double ss = 0.0;
    for (int i = lane; i < head_dim; i += 32) ss += (double)h[i] * (double)h[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    double s = (double)scale / sqrt(ss / head_dim + (double)eps);
    for (int i = lane; i < head_dim; i += 32) h[i] = (float)__dmul_rn((double)h[i], s);
}
