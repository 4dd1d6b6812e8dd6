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
    pdl_wait();  // launched programmatically (lib.rs launch_small): nothing read or written before
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        double gv = g[i];
        out[i] = (float)__dmul_rn(gv / (1.0 + exp(-gv)), (double)u[i]);
    }
}

// `--mode fast`'s SwiGLU of several tokens: the same function in f32 (expf, IEEE division and product: a few f32
// ulp from the f64 form above). The f64 exp made a 512-token prompt's SwiGLU compute-bound on
// the H200's f64 units (97 us per layer for 512 x 19968 values, 5.0 ms of a 42 ms prompt,
// 2026-11-30); the fast mode's products already round far coarser than this.
extern "C" __global__ void swiglu_fast(const float* g, const float* u, float* out, long long n) {
    pdl_trigger();
    pdl_wait();  // launched programmatically (lib.rs launch_small): nothing read or written before
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float gv = g[i];
        out[i] = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv))), u[i]);
    }
}

// swiglu_fast on a joint product's output (y8_joint): token t's gate at y[t 2f + i], its up at
// y[t 2f + f + i]; out[t f + i]. The same arithmetic as swiglu_fast. Grid: x over columns,
// y over tokens.
extern "C" __global__ void swiglu_joint(const float* y, float* out, int f, int rows) {
    pdl_trigger();
    for (int t = blockIdx.y; t < rows; t += gridDim.y) {
        const float* yt = y + (long long)t * 2 * f;
        float* ot = out + (long long)t * f;
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < f; c += gridDim.x * blockDim.x) {
            const float gv = yt[c];
            ot[c] = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv))), yt[f + c]);
        }
    }
}

// x = cap * tanh(x * scale / cap), or x * scale when cap == 0.
extern "C" __global__ void logit_finish(float* x, long long n, float scale, float cap) {
    pdl_wait();  // launched programmatically (lib.rs launch_small): nothing read or written before
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
template <typename T>
__device__ __forceinline__ void amax_pick(T& best, int& idx, T v, int i) {
    if (v > best || (v == best && i < idx)) { best = v; idx = i; }
}
template <typename T>
__device__ __forceinline__ void amax_block(T& best, int& idx) {
    __shared__ T bv[32];
    __shared__ int bi[32];
    for (int o = 16; o > 0; o >>= 1) {
        T ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        amax_pick(best, idx, ov, oi);
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) { bv[w] = best; bi[w] = idx; }
    __syncthreads();
    int nw = blockDim.x >> 5;
    best = lane < nw ? bv[lane] : (T)-__int_as_float(0x7f800000);
    idx = lane < nw ? bi[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
        T ov = __shfl_xor_sync(0xffffffffu, best, o);
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

// Edits to logits rows before a draw (sampling.rs LogitEdit, the same f32 operations unfused),
// with the effect of applying each row's edits in list order: one block per drawn row, its first
// thread walks the edits start[d]..par[d] in order, then the block's threads share the rest,
// par[d]..start[d + 1], which the host has checked touch distinct tokens (a sampler's penalties,
// one per token of its window). Edit e is 4 words {token, kind (0 add, 1 mask, 2 penalize), a,
// b (f32 bits)}.
__device__ __forceinline__ void logit_edit(float* __restrict__ r, int cols, const u32* __restrict__ w) {
    if (w[0] >= (u32)cols) return;
    const float a = __uint_as_float(w[2]), b = __uint_as_float(w[3]);
    float v = r[w[0]];
    if (w[1] == 0u) {
        v = __fadd_rn(v, a);
    } else if (w[1] == 1u) {
        v = -__int_as_float(0x7f800000);
    } else {
        if (a != 1.0f) v = v > 0.0f ? __fdiv_rn(v, a) : __fmul_rn(v, a);
        v = __fsub_rn(v, b);
    }
    r[w[0]] = v;
}
extern "C" __global__ void logit_edits(float* __restrict__ x, int cols, const u32* __restrict__ rowix, const u32* __restrict__ start, const u32* __restrict__ par, const u32* __restrict__ ed) {
    const int d = blockIdx.x;
    float* r = x + (long long)rowix[d] * cols;
    if (threadIdx.x == 0)
        for (u32 e = start[d]; e < par[d]; e++) logit_edit(r, cols, ed + 4ull * e);
    __syncthreads();
    for (u32 e = par[d] + threadIdx.x; e < start[d + 1]; e += blockDim.x) logit_edit(r, cols, ed + 4ull * e);
}

// Rows rowix[d] of x into row d of out: a draw's own copy of its rows, which it edits, so the
// logits stay as the forward pass left them (a row may be drawn again, under a grammar's mask).
// grid (chunks, draws).
extern "C" __global__ void gather_rows(const float* __restrict__ x, int cols, const u32* __restrict__ rowix, float* __restrict__ out) {
    const float* r = x + (long long)rowix[blockIdx.y] * cols;
    float* o = out + (long long)blockIdx.y * cols;
    const int per = (cols + gridDim.x - 1) / gridDim.x;
    const int c0 = blockIdx.x * per, c1 = min(cols, c0 + per);
    for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x) o[c] = r[c];
}

// A grammar's mask over row d (sampling.rs RowDraw::allowed, after the edits): every token whose
// bit (bit c % 64 of word c / 64 of mask mi[d], mw words each) is clear becomes -inf. A row
// with mi[d] = 0xffffffff has no mask. grid (chunks, draws).
extern "C" __global__ void logit_allowed(float* __restrict__ x, int cols, const u32* __restrict__ mi, const u64* __restrict__ masks, int mw) {
    const u32 k = mi[blockIdx.y];
    if (k == 0xffffffffu) return;
    float* r = x + (long long)blockIdx.y * cols;
    const u64* m = masks + (long long)k * mw;
    const int per = (cols + gridDim.x - 1) / gridDim.x;
    const int c0 = blockIdx.x * per, c1 = min(cols, c0 + per);
    for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x)
        if (!((m[c >> 6] >> (c & 63)) & 1ull)) r[c] = -__int_as_float(0x7f800000);
}

// Whether each drawn row's logits, before its edits, hold a NaN or an infinity (the host's
// check, sampling.rs NOT_FINITE: a damaged file's overflow, which a draw would turn into some
// token). grid (chunks, draws); any block that finds one sets bad[d] (zeroed by the caller).
extern "C" __global__ void rows_not_finite(const float* x, int cols, const u32* rowix, u32* bad) {
    const int d = blockIdx.y;
    const float* r = x + (long long)rowix[d] * cols;
    const int per = (cols + gridDim.x - 1) / gridDim.x;
    const int c0 = blockIdx.x * per, c1 = min(cols, c0 + per);
    int found = 0;
    for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x)
        found |= (__float_as_uint(r[c]) & 0x7f800000u) == 0x7f800000u;
    if (__syncthreads_or(found) && threadIdx.x == 0) bad[d] = 1u;
}

// Position k of the SplitMix64 stream of `seed` (sampling.rs Rng::at).
__device__ __forceinline__ u64 splitmix_at(u64 seed, u64 k) {
    u64 z = seed + (k + 1ull) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// A logit's place in candidate order (sampling.rs order_key): larger values, larger keys.
__device__ __forceinline__ u32 order_key(float v) {
    const u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
// Top-p's weight of a candidate (sampling.rs cut_weight): exp(v - m) in units of 2^-44, rounded
// to nearest; 1 exactly at m, 0 for NaN.
__device__ __forceinline__ u64 cut_weight(float v, float m) {
    if (v == m) return 1ull << 44;
    const double e = exp((double)v - (double)m);
    return e >= 0.0 ? __double2ull_rn(__dmul_rn(e, 0x1p44)) : 0ull;
}
__device__ __forceinline__ bool cut_holds(u32 k, u32 id, u32 ck, u32 ci) { return k > ck || (k == ck && id <= ci); }

// Among row r's tokens within the cut (ck, ci) (NaN never), the shortest prefix in candidate
// order whose weight (1 a token, or cut_weight when WEIGHTS) reaches the goal (top-k's k, or
// top-p's target of their total, sampling.rs top_p_target), as a cut: sampling.rs select_cut,
// the same radix selection (8 bits of order_key a pass; each pass's histogram summed by warp
// first, __match_any_sync, then one shared atomic per bin and warp: integer sums, so the same
// in any order). Returns false for no cut (top-k's k reaches every token). The block's threads
// all call it; the result is in every thread's (ok, oi).
template <bool WEIGHTS>
__device__ bool select_cut(const float* __restrict__ r, int cols, float m, u32 ck, u32 ci, u32 kk, double top_p, u32& ok, u32& oi) {
    __shared__ u64 hist[256];
    __shared__ u32 s_prefix, s_id;
    __shared__ u64 s_above, s_goal, s_each;
    __shared__ bool s_none;
    __shared__ u32 s_wc[32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int span = (cols + blockDim.x - 1) / blockDim.x * blockDim.x;  // a warp's lanes loop together
    if (tid == 0) { s_prefix = 0u; s_above = 0ull; }
    for (int pass = 0; pass < 4; pass++) {
        const int shift = 24 - 8 * pass;
        for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0ull;
        __syncthreads();
        const u32 prefix = s_prefix;
        for (int c = tid; c < span; c += blockDim.x) {
            u32 bin = 256u;
            u64 w = 0ull;
            if (c < cols) {
                const float v = r[c];
                const u32 k = order_key(v);
                if (!isnan(v) && cut_holds(k, (u32)c, ck, ci) && (pass == 0 || (k >> (shift + 8)) == prefix)) {
                    bin = (k >> shift) & 255u;
                    w = WEIGHTS ? cut_weight(v, m) : 1ull;
                }
            }
            // Weights below 2^44 + 1: two 22-bit halves, each summed over a warp in 32 bits.
            const u32 peers = __match_any_sync(0xffffffffu, bin);
            const u32 lo = __reduce_add_sync(peers, (u32)(w & 0x3fffffull));
            const u32 hi = __reduce_add_sync(peers, (u32)(w >> 22));
            if (bin < 256u && lane == __ffs(peers) - 1) atomicAdd((unsigned long long*)&hist[bin], ((u64)hi << 22) + lo);
        }
        __syncthreads();
        if (tid == 0) {
            if (pass == 0) {
                u64 total = 0ull;
                for (int b = 0; b < 256; b++) total += hist[b];
                s_none = total == 0ull || (!WEIGHTS && total <= (u64)kk);
                if (WEIGHTS) {
                    const double t = ceil(__dmul_rn(top_p, (double)total));
                    s_goal = !(t >= 1.0) ? 1ull : t >= (double)total ? total : (u64)t;
                } else {
                    s_goal = kk;
                }
            }
            u64 above = s_above;
            int b = 255;
            while (b > 0 && above + hist[b] < s_goal) { above += hist[b]; b--; }
            s_above = above;
            s_prefix = (prefix << 8) | (u32)b;
        }
        __syncthreads();
        if (s_none) return false;
    }
    // The tokens at the boundary key in id order: as many as reach the goal. Their count, first
    // and last id, and one's weight (all the same: one key, one value).
    const u32 K = s_prefix;
    __shared__ u32 s_first, s_last, s_tied;
    if (tid == 0) { s_id = 0xffffffffu; s_each = 1ull; s_first = 0xffffffffu; s_last = 0u; s_tied = 0u; }
    __syncthreads();
    u32 mine = 0u;
    for (int c = tid; c < cols; c += blockDim.x) {
        const float v = r[c];
        if (!isnan(v) && order_key(v) == K && cut_holds(K, (u32)c, ck, ci)) {
            if (mine == 0u && WEIGHTS) s_each = cut_weight(v, m);  // every tied token's weight is the same
            mine++;
            atomicMin(&s_first, (u32)c);
            atomicMax(&s_last, (u32)c);
        }
    }
    if (mine) atomicAdd(&s_tied, mine);
    __syncthreads();
    const u64 each = s_each > 0ull ? s_each : 1ull;
    const u64 need = (s_goal - s_above + each - 1ull) / each;
    ok = K;
    if (need >= (u64)s_tied) { oi = s_last; return true; }
    if (need <= 1ull) { oi = s_first; return true; }
    // The need-th tied token in id order, blockDim.x ids at a time (seen: those before, the same
    // in every thread).
    u64 seen = 0ull;
    for (int base = 0; base < cols; base += blockDim.x) {
        const int c = base + tid;
        bool t = false;
        if (c < cols) {
            const float v = r[c];
            t = !isnan(v) && order_key(v) == K && cut_holds(K, (u32)c, ck, ci);
        }
        const int n = __syncthreads_count(t);
        if (seen + (u64)n >= need) {
            const u32 bal = __ballot_sync(0xffffffffu, t);
            if (lane == 0) s_wc[warp] = __popc(bal);
            __syncthreads();
            u64 before = seen;
            for (int w = 0; w < warp; w++) before += s_wc[w];
            before += __popc(bal & ((1u << lane) - 1u));
            if (t && before + 1ull == need) s_id = (u32)c;
            __syncthreads();
            break;
        }
        seen += (u64)n;
    }
    oi = s_id;
    return true;
}

// The cut top-k then top-p leave of each drawn row (sampling.rs draw_cut, RowDraw::cut): the
// row's largest at amax[d] (argmax_rows); top-k k = topk[d] (0: none), top-p p = topp[d] (1:
// none); out[2d], out[2d + 1] = (key, id), (0, 0xffffffff) for no cut. One block of 1024 threads
// per row.
extern "C" __global__ void draw_cut(const float* __restrict__ x, int cols, const u32* __restrict__ amax, const u32* __restrict__ topk, const double* __restrict__ topp, u32* __restrict__ out) {
    const int d = blockIdx.x;
    const float* r = x + (long long)d * cols;
    const u32 g = amax[d], kk = topk[d];
    const double p = topp[d];
    u32 ck = 0u, ci = 0xffffffffu;
    if (g < (u32)cols) {
        const float m = r[g];
        u32 k2, i2;
        if (kk > 0u && kk < (u32)cols && select_cut<false>(r, cols, m, ck, ci, kk, 0.0, k2, i2)) { ck = k2; ci = i2; }
        __syncthreads();
        if (p < 1.0 && select_cut<true>(r, cols, m, ck, ci, 0u, p, k2, i2)) { ck = k2; ci = i2; }
    }
    if (threadIdx.x == 0) { out[2 * d] = ck; out[2 * d + 1] = ci; }
}

// Log-probabilities in rows of logits (sampling.rs RowLogprob::of, the host's log_softmax in
// f64): for row rowix[d], its first token in candidate order (the largest order_key, the lowest
// id among ties; a NaN never) and its value m, then lse = m + ln(sum exp(v - m)) with the sum in
// f64 (each thread's values in order, then the warps' sums in a fixed tree). Row d of out, stride
// floats from out + d * stride: [0] = x[target[d]] - lse (-inf for a target past the row), [1] =
// how many alternatives follow (as bits), then (id as bits, v - lse) for the first top[d] tokens
// in candidate order (at most MAX_TOP; one is the first token, more are select_cut's top-k
// prefix). One block of 1024 threads per row.
#define MAX_TOP 20
extern "C" __global__ void row_logprobs(const float* __restrict__ x, int cols, const u32* __restrict__ rowix, const u32* __restrict__ target, const u32* __restrict__ top, int stride, float* __restrict__ out) {
    __shared__ double wsum[32];
    __shared__ u64 wbest[32];
    __shared__ double total;
    __shared__ u64 first;
    __shared__ u32 s_n, s_id[MAX_TOP], s_key[MAX_TOP];
    const int d = blockIdx.x, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int warps = (int)(blockDim.x >> 5);
    const float* r = x + (long long)rowix[d] * cols;
    // The first token: the largest (order_key << 32 | ~id), 0 when every value is NaN.
    u64 b = 0ull;
    for (int c = tid; c < cols; c += blockDim.x) {
        const float v = r[c];
        if (!isnan(v)) {
            const u64 k = ((u64)order_key(v) << 32) | (u64)(~(u32)c);
            b = k > b ? k : b;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const u64 ob = __shfl_down_sync(0xffffffffu, b, o);
        b = ob > b ? ob : b;
    }
    if (lane == 0) wbest[w] = b;
    __syncthreads();
    if (tid == 0) {
        u64 t = 0ull;
        for (int i = 0; i < warps; i++) t = wbest[i] > t ? wbest[i] : t;
        first = t;
    }
    __syncthreads();
    const bool any = first != 0ull;
    const u32 id0 = ~(u32)first;
    const float mf = any ? r[id0] : -__int_as_float(0x7f800000);
    const double m = (double)mf;
    double s = 0.0;
    for (int c = tid; c < cols; c += blockDim.x) s += exp((double)r[c] - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) wsum[w] = s;
    __syncthreads();
    if (w == 0) {
        double t = lane < warps ? wsum[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_down_sync(0xffffffffu, t, o);
        if (lane == 0) total = t;
    }
    __syncthreads();
    const double lse = m + log(total);
    float* o = out + (long long)d * stride;
    const u32 n = top[d] < (u32)MAX_TOP ? top[d] : (u32)MAX_TOP;
    if (tid == 0) {
        const u32 t = target[d];
        o[0] = t < (u32)cols ? (float)((double)r[t] - lse) : -__int_as_float(0x7f800000);
        o[1] = __uint_as_float(0u);
    }
    if (n == 0u || !any) return;  // the same for every thread of the block
    if (n == 1u) {
        if (tid == 0) {
            o[1] = __uint_as_float(1u);
            o[2] = __uint_as_float(id0);
            o[3] = (float)(m - lse);
        }
        return;
    }
    // Two or more: the top-k prefix's cut (none when the row has at most n tokens that are not
    // NaN), its tokens gathered in any order, then put in candidate order by thread 0.
    u32 ck = 0u, ci = 0xffffffffu;
    select_cut<false>(r, cols, mf, 0u, 0xffffffffu, n, 0.0, ck, ci);
    if (tid == 0) s_n = 0u;
    __syncthreads();
    for (int c = tid; c < cols; c += blockDim.x) {
        const float v = r[c];
        const u32 k = order_key(v);
        if (!isnan(v) && cut_holds(k, (u32)c, ck, ci)) {
            const u32 j = atomicAdd(&s_n, 1u);
            if (j < (u32)MAX_TOP) { s_id[j] = (u32)c; s_key[j] = k; }
        }
    }
    __syncthreads();
    if (tid == 0) {
        const u32 cnt = s_n < n ? s_n : n;
        for (u32 i = 1; i < cnt; i++) {
            const u32 ki = s_key[i], ii = s_id[i];
            u32 j = i;
            while (j > 0u && (s_key[j - 1] < ki || (s_key[j - 1] == ki && s_id[j - 1] > ii))) {
                s_key[j] = s_key[j - 1];
                s_id[j] = s_id[j - 1];
                j--;
            }
            s_key[j] = ki;
            s_id[j] = ii;
        }
        o[1] = __uint_as_float(cnt);
        for (u32 i = 0; i < cnt; i++) {
            o[2 + 2 * i] = __uint_as_float(s_id[i]);
            o[3 + 2 * i] = (float)((double)r[s_id[i]] - lse);
        }
    }
}

// One token per drawn row, by the Gumbel-max trick (sampling.rs RowDraw::choose, its
// reference): candidates exp(v - m) >= min_p (m the row's largest, at amax[row], from
// argmax_rows), score v * inv_t + g with g = -ln(-ln(u)) from the row's seeded stream at
// (counter << 32) | id, or v when greedy (inv_t = 0); the largest score, lowest id among ties.
// par[2d] = inv_t, par[2d + 1] = min_p; key[2d] = seed, key[2d + 1] = counter; only tokens in
// the cut (cut[2d], cut[2d + 1]) from draw_cut, (0, 0xffffffff) for all. grid (chunks,
// draws), 1024 threads; the last block of a draw merges the chunks (as argmax_rows). A row
// rows_not_finite marked (bad[d]) gets 0xffffffff (NOT_FINITE), no token.
extern "C" __global__ void draw_rows(const float* x, int cols, const u32* rowix, const u32* amax, const double* par, const u64* key, const u32* cut, const u32* bad, u32* out, double* pv, int* pi, unsigned* cnt) {
    __shared__ bool last;
    const int d = blockIdx.y;
    const float* r = x + (long long)rowix[d] * cols;
    const u32 g = amax[rowix[d]];
    const bool any = g < (u32)cols;
    const double m = any ? (double)r[g] : 0.0;
    const double inv_t = par[2 * d], min_p = par[2 * d + 1];
    const u64 seed = key[2 * d], ctr = key[2 * d + 1] << 32;
    const u32 ck = cut[2 * d], ci = cut[2 * d + 1];
    const int per = (cols + gridDim.x - 1) / gridDim.x;
    const int c0 = blockIdx.x * per, c1 = min(cols, c0 + per);
    double best = -(double)__int_as_float(0x7f800000);
    int idx = 0x7fffffff;
    for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
        const double v = r[c];
        if (!cut_holds(order_key(r[c]), (u32)c, ck, ci)) continue;
        if (min_p > 0.0 && !(exp(v - m) >= min_p)) continue;
        double s = v;
        if (inv_t != 0.0) {
            const u64 z = splitmix_at(seed, ctr | (u64)c);
            const double u = __dmul_rn((double)(z >> 11) + 0.5, 0x1p-53);
            s = __dadd_rn(__dmul_rn(v, inv_t), -log(-log(u)));
        }
        if (!(s > best)) continue;  // -inf (a masked token) or NaN is no candidate
        amax_pick(best, idx, s, c);
    }
    amax_block(best, idx);
    if (gridDim.x > 1) {
        const long long slot = (long long)d * gridDim.x + blockIdx.x;
        if (threadIdx.x == 0) {
            pv[slot] = best;
            pi[slot] = idx;
            __threadfence();
            last = atomicAdd(&cnt[d], 1u) == gridDim.x - 1;
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
        best = -(double)__int_as_float(0x7f800000);
        idx = 0x7fffffff;
        for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) {
            const long long k = (long long)d * gridDim.x + b;
            amax_pick(best, idx, __ldcg(pv + k), __ldcg(pi + k));
        }
        amax_block(best, idx);
    }
    if (threadIdx.x == 0) {
        out[d] = bad[d] ? 0xffffffffu : idx != 0x7fffffff ? (u32)idx : (any ? g : 0u);
        if (gridDim.x > 1) cnt[d] = 0u;
    }
}
