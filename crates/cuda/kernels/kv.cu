// Writing the KV cache, preparing queries and keys, and merging attention splits.
//
// A cache row holds n_kv_head*head_dim values in the cache type; a sliding layer's rows live in a
// ring (slot = pos % ring), a full layer's in a plane (slot = pos). Positions come from device
// memory, so a captured graph replays at every step.

// (The cache types KV_*: common.cuh, which attention.cu reads too.)

__device__ __forceinline__ long long kv_slot(u32 pos, int ring) {
    return ring > 0 ? (long long)(pos % (u32)ring) : (long long)pos;
}

// Store DPL consecutive values x (elements e0..e0+DPL of a row) in the cache type. For q8_0 the
// 32-value block spans 32/DPL consecutive lanes of the warp (ggml's reference quantizer:
// d = amax/127, q = roundf(x/d)).
template <int DPL>
__device__ __forceinline__ void store_vals(u8* row, int e0, const float* x, int kt, int lane) {
    if (kt == KV_F32) {
#pragma unroll
        for (int i = 0; i < DPL; i++) ((float*)row)[e0 + i] = x[i];
    } else if (kt == KV_F16) {
#pragma unroll
        for (int i = 0; i < DPL; i++) ((u16*)row)[e0 + i] = f2h(x[i]);
    } else if (kt == KV_BF16) {
#pragma unroll
        for (int i = 0; i < DPL; i++) ((u16*)row)[e0 + i] = f2bf(x[i]);
    } else {
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) amax = fmaxf(amax, fabsf(x[i]));
        for (int o = 1; o < 32 / DPL; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        u8* blk = row + (e0 >> 5) * 34;
#pragma unroll
        for (int i = 0; i < DPL; i++) blk[2 + ((e0 + i) & 31)] = (u8)(signed char)roundf(x[i] * id);
        if ((e0 & 31) == 0) {
            u16 h = f2h(d);
            blk[0] = (u8)(h & 0xFF);
            blk[1] = (u8)(h >> 8);
        }
    }
}

// Store this batch's K and V rows (f32) in the cache type at their slots. grid (n_tokens).
extern "C" __global__ void kv_store(const float* k, const float* v, const u64* seqtab, int layer, long long row_bytes,
                                    const u32* pos, int kv_dim, int kt) {
    const int t = blockIdx.x;
    u8 *kc, *vc;
    int ring;
    kv_layer(seqtab, t, layer, &kc, &vc, &ring);
    const long long slot = kv_slot(pos[t], ring);
    const float* ks = k + (long long)t * kv_dim;
    const float* vs = v + (long long)t * kv_dim;
    u8* kd = kc + slot * row_bytes;
    u8* vd = vc + slot * row_bytes;
    // One warp per 32 values: 32 lanes x 1 value (DPL = 1) covers one q8_0 block.
    const int lane = threadIdx.x & 31;
    for (int b = threadIdx.x >> 5; b < 2 * (kv_dim / 32); b += blockDim.x >> 5) {
        const bool is_k = b < kv_dim / 32;
        const int e0 = 32 * (is_k ? b : b - kv_dim / 32) + lane;
        float x = is_k ? ks[e0] : vs[e0];
        store_vals<1>(is_k ? kd : vd, e0, &x, kt, lane);
    }
}

// The per-layer query/key preparation of one micro-batch in one launch, one warp per head
// (grid: n_head + 2*n_kv_head heads x n_tokens): QK-norm of q heads (times q_scale) and k heads,
// NORM RoPE of both when `inv_freq` is given, q written back in place, k and v stored in the
// cache. The arithmetic of head_norm, rope_norm and kv_store.
template <int HD>
__device__ __forceinline__ void qkv_prep_impl(float* q, const float* k, const float* v, int n_head, int n_kv_head,
                                              float eps, float q_scale, const u32* pos, const double* inv_freq,
                                              const u64* seqtab, int layer, long long row_bytes, int kt) {
    constexpr int DPL = HD / 32;
    const int h = blockIdx.x, t = blockIdx.y, lane = threadIdx.x & 31;
    const int kv_dim = n_kv_head * HD;
    pdl_wait();  // launched programmatically (lib.rs launch_small): nothing read or written before
    const bool is_q = h < n_head, is_k = !is_q && h < n_head + n_kv_head;
    const int hh = is_q ? h : (is_k ? h - n_head : h - n_head - n_kv_head);
    const float* src = is_q ? q + ((long long)t * n_head + hh) * HD
                            : (is_k ? k : v) + (long long)t * kv_dim + (long long)hh * HD;
    float x[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) x[i] = src[lane * DPL + i];
    if (is_q || is_k) {
        double ss = 0.0;
#pragma unroll
        for (int i = 0; i < DPL; i++) ss += (double)x[i] * (double)x[i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        double s = (double)(is_q ? q_scale : 1.0f) / sqrt(ss / HD + (double)eps);
#pragma unroll
        for (int i = 0; i < DPL; i++) x[i] = (float)__dmul_rn((double)x[i], s);
        if (inv_freq) {
#pragma unroll
            for (int i = 0; i < DPL; i += 2) {
                const int j = (lane * DPL + i) / 2;
                double theta = __dmul_rn((double)pos[t], inv_freq[j]);
                double sn, cs;
                sincos(theta, &sn, &cs);
                double x0 = x[i], x1 = x[i + 1];
                x[i] = (float)__dsub_rn(__dmul_rn(x0, cs), __dmul_rn(x1, sn));
                x[i + 1] = (float)__dadd_rn(__dmul_rn(x0, sn), __dmul_rn(x1, cs));
            }
        }
    }
    if (is_q) {
        float* dst = q + ((long long)t * n_head + hh) * HD;
#pragma unroll
        for (int i = 0; i < DPL; i++) dst[lane * DPL + i] = x[i];
    } else {
        u8 *kc, *vc;
        int ring;
        kv_layer(seqtab, t, layer, &kc, &vc, &ring);
        u8* row = (is_k ? kc : vc) + kv_slot(pos[t], ring) * row_bytes;
        store_vals<DPL>(row, hh * HD + lane * DPL, x, kt, lane);
    }
}

extern "C" __global__ void qkv_prep_64(float* q, const float* k, const float* v, int n_head, int n_kv_head, float eps,
                                       float q_scale, const u32* pos, const double* inv_freq, const u64* seqtab, int layer,
                                       long long row_bytes, int kt) {
    qkv_prep_impl<64>(q, k, v, n_head, n_kv_head, eps, q_scale, pos, inv_freq, seqtab, layer, row_bytes, kt);
}
extern "C" __global__ void qkv_prep_128(float* q, const float* k, const float* v, int n_head, int n_kv_head, float eps,
                                        float q_scale, const u32* pos, const double* inv_freq, const u64* seqtab, int layer,
                                        long long row_bytes, int kt) {
    qkv_prep_impl<128>(q, k, v, n_head, n_kv_head, eps, q_scale, pos, inv_freq, seqtab, layer, row_bytes, kt);
}

// grid (n_head, n_tokens), HD threads: out[t][h] = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M)
// over the splits that hold keys (the partial kernel's arithmetic on the position), times
// sigmoid(gate) (f64, as the CPU's sigmoid_gate). The splits' (m, l) are loaded together into
// shared memory and one thread forms M, the weights and L in split order; then each thread adds
// its dimension over the splits in order (loads independent of each other).
#define COMBINE_MAX_SPLITS 64  // lib.rs ATTN_MAX_SPLITS, the host's clamp on n_split (attend_cached)
// COMBINE_PRELOAD (8 by default; MUSER_NVRTC_DEFINES=COMBINE_PRELOAD=N to measure others, 0
// leaves it out): each thread loads its first N splits' values before the barriers, with the
// splits' (m, l), instead of after the weights. The same products summed in the same order: the
// same bits. H200, 2026-11-30 (twelfth session): decode 150.95/150.89 tokens/s against 150.12
// without it, alternating in one call.
#ifndef COMBINE_PRELOAD
#define COMBINE_PRELOAD 8
#endif
extern "C" __global__ void attn_combine(const float* part, int n_split, int nrep, int hd, int n_kv_head,
                                        const u32* pos, int n_swa, const float* gate, float* out) {
    __shared__ float sm[COMBINE_MAX_SPLITS], sl[COMBINE_MAX_SPLITS], sc[COMBINE_MAX_SPLITS];
    __shared__ float sL;
    pdl_trigger();  // the output projection may start loading its weights
    pdl_wait();  // launched programmatically (lib.rs launch_small): nothing read or written before
    const int h = blockIdx.x, t = blockIdx.y, d = threadIdx.x;
    const int g = h / nrep, r = h % nrep;
    const int p = (int)pos[t];
    const int lo = n_swa > 0 ? max(0, p - n_swa + 1) : 0;
    const int n_keys = p - lo + 1;
    const int chunk = attn_chunk(n_keys, n_split);
    const int used = min((n_keys + chunk - 1) / chunk, COMBINE_MAX_SPLITS);
    const float* base = part + (((long long)t * n_kv_head + g) * n_split * nrep) * (hd + 2);
#if COMBINE_PRELOAD > 0
    // The first COMBINE_PRELOAD splits' values of this dimension, loaded with (m, l) rather than
    // after the weights: one round trip to L2 fewer on the token's path; the same sum below.
    float pre[COMBINE_PRELOAD];
#pragma unroll
    for (int s = 0; s < COMBINE_PRELOAD; s++) pre[s] = s < used ? base[((long long)s * nrep + r) * (hd + 2) + d] : 0.0f;
#endif
    for (int s = d; s < used; s += blockDim.x) {
        const float* e = base + ((long long)s * nrep + r) * (hd + 2);
        sm[s] = e[hd];
        sl[s] = e[hd + 1];
    }
    __syncthreads();
    if (d == 0) {
        float M = -__int_as_float(0x7f800000);
        for (int s = 0; s < used; s++)
            if (sl[s] > 0.0f) M = fmaxf(M, sm[s]);
        float L = 0.0f;
        for (int s = 0; s < used; s++) {
            const float c = sl[s] > 0.0f ? expf(sm[s] - M) : 0.0f;
            sc[s] = c;
            if (sl[s] > 0.0f) L += sl[s] * c;
        }
        sL = L;
    }
    __syncthreads();
    float a = 0.0f;
#if COMBINE_PRELOAD > 0
#pragma unroll
    for (int s = 0; s < COMBINE_PRELOAD; s++)
        if (s < used && sl[s] > 0.0f) a += pre[s] * sc[s];
#pragma unroll 8
    for (int s = COMBINE_PRELOAD; s < used; s++)
        if (sl[s] > 0.0f) a += base[((long long)s * nrep + r) * (hd + 2) + d] * sc[s];
#else
#pragma unroll 8
    for (int s = 0; s < used; s++)
        if (sl[s] > 0.0f) a += base[((long long)s * nrep + r) * (hd + 2) + d] * sc[s];
#endif
    long long o = (long long)t * nrep * n_kv_head * hd + (long long)h * hd + d;
    float v = a / sL;
    out[o] = gate ? (float)((double)v / (1.0 + exp(-(double)gate[o]))) : v;
}
