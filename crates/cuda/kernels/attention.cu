// Attention over the device KV cache: split-K flash decoding.
//
// Each token reads its own sequence's cache (seqtab, common.cuh kv_layer). The cache of a layer holds rows of n_kv_head*head_dim values in the cache type; a sliding
// layer's rows live in a ring (slot = pos % ring, ring = n_swa + the largest micro-batch, so a
// whole micro-batch is stored before it is read), a full layer's in a plane (slot = pos).
// Key j is visible to the query at position p iff j <= p, and p - j < n_swa on sliding layers.
//
// attn_partial: grid (n_kv_head x NREP / HPB, n_split, n_tokens), 4 warps. Each block takes one
// split of the visible keys for HPB of the NREP query heads that share one KV head (one read of
// K and V serves them): HPB = NREP (`attn_*`) for prompts and batches, where the blocks are many;
// HPB = NREP / 4 (`attn_*_g4`) for a few tokens, four times the blocks and a quarter of each
// one's chain of dependent work. A head's arithmetic is the same in both. Scores: lanes own
// keys; V: lanes own dimensions. Online softmax in f32.
// attn_combine merges the splits and applies the output gate: out = attn * sigmoid(gate).

#define KV_F32 0
#define KV_F16 1
#define KV_BF16 2
#define KV_Q8_0 3
// (kv.cu holds the KV store, the fused QK preparation and attn_combine.)

// 8 consecutive values d0..d0+7 of a cache row (head g's slice starts at g*HD).
template <int KT>
__device__ __forceinline__ void load8(const u8* row, int d0, float* o) {
    if (KT == KV_F32) {
        float4 a = *(const float4*)(row + 4 * d0), b = *((const float4*)(row + 4 * d0) + 1);
        o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w; o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
    } else if (KT == KV_F16 || KT == KV_BF16) {
        uint4 u = *(const uint4*)(row + 2 * d0);
        u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (KT == KV_F16) { o[2 * i] = h2f((u16)(w[i] & 0xFFFF)); o[2 * i + 1] = h2f((u16)(w[i] >> 16)); }
            else { o[2 * i] = __uint_as_float(w[i] << 16); o[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u); }
        }
    } else {
        const u8* blk = row + (d0 >> 5) * 34;
        float d = h2f((u16)(blk[0] | (blk[1] << 8)));
#pragma unroll
        for (int i = 0; i < 8; i++) o[i] = __fmul_rn((float)(signed char)blk[2 + (d0 & 31) + i], d);
    }
}

template <int KT>
__device__ __forceinline__ float load1(const u8* row, int d) {
    if (KT == KV_F32) return ((const float*)row)[d];
    if (KT == KV_F16) return h2f(((const u16*)row)[d]);
    if (KT == KV_BF16) return bf2f(((const u16*)row)[d]);
    const u8* blk = row + (d >> 5) * 34;
    return __fmul_rn((float)(signed char)blk[2 + (d & 31)], h2f((u16)(blk[0] | (blk[1] << 8))));
}

// N (2 or 4) consecutive values d0.. of a cache row: one 4-, 8- or 16-byte load (f32, f16, bf16;
// d0 a multiple of N, rows 16-byte aligned), bytes one by one for q8_0 (as load1).
template <int KT, int N>
__device__ __forceinline__ void loadv(const u8* row, int d0, float* o) {
    if (KT == KV_F32) {
        if (N == 4) { const float4 a = *(const float4*)(row + 4 * d0); o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w; }
        else { const float2 a = *(const float2*)(row + 4 * d0); o[0] = a.x; o[1] = a.y; }
    } else if (KT == KV_F16 || KT == KV_BF16) {
        u32 w[2];
        if (N == 4) { const uint2 a = *(const uint2*)(row + 2 * d0); w[0] = a.x; w[1] = a.y; }
        else { w[0] = *(const u32*)(row + 2 * d0); }
#pragma unroll
        for (int i = 0; i < N / 2; i++) {
            if (KT == KV_F16) { o[2 * i] = h2f((u16)(w[i] & 0xFFFF)); o[2 * i + 1] = h2f((u16)(w[i] >> 16)); }
            else { o[2 * i] = __uint_as_float(w[i] << 16); o[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u); }
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) o[i] = load1<KT>(row, d0 + i);
    }
}

template <int NREP, int HD, int KT, int HPB>
__device__ __forceinline__ void attn_partial_impl(const float* __restrict__ q, const u64* __restrict__ seqtab,
                                                  int layer, long long row_bytes,
                                                  const u32* __restrict__ pos, int n_swa, float scale, int n_kv_head,
                                                  float* __restrict__ part) {
    static_assert(NREP % HPB == 0, "head groups must divide the query heads of a KV head");
    constexpr int DPL = HD / 32;
    // One buffer, two lives: the scaled queries and the warps' probabilities during the key
    // loop, then the four warps' accumulators for the merge (static shared memory is 48 KB).
    constexpr int LOOP = HPB * HD + 4 * HPB * 32, MERGE = 4 * HPB * HD;
    __shared__ __align__(16) float smem[LOOP > MERGE ? LOOP : MERGE];
    __shared__ float wm[4][HPB], wl[4][HPB];
    float* qs = smem;
    float (*ps)[HPB][32] = (float (*)[HPB][32])(smem + HPB * HD);
    float (*wacc)[HPB * HD] = (float (*)[HPB * HD])smem;
    // KV head g, its query heads h0 .. h0 + HPB - 1 (of NREP).
    const int g = blockIdx.x / (NREP / HPB), h0 = (blockIdx.x % (NREP / HPB)) * HPB;
    const int split = blockIdx.y, t = blockIdx.z, n_split = gridDim.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_head = n_kv_head * NREP;
    const int p = (int)pos[t];
    u8 *kcm, *vcm;
    int ring;
    kv_layer(seqtab, t, layer, &kcm, &vcm, &ring);
    const u8* __restrict__ kc = kcm;
    const u8* __restrict__ vc = vcm;
    const int lo = n_swa > 0 ? max(0, p - n_swa + 1) : 0;
    const int n_keys = p - lo + 1;
    const int chunk = (n_keys + n_split - 1) / n_split;
    const int k0 = lo + split * chunk, k1 = min(p + 1, k0 + chunk);
    if (k0 >= k1) return;  // an empty split: attn_combine skips it (same arithmetic on pos)
    for (int i = threadIdx.x; i < HPB * HD; i += blockDim.x)
        qs[i] = q[(long long)t * n_head * HD + ((long long)g * NREP + h0) * HD + i] * scale;
    __syncthreads();

    float m[HPB], l[HPB], acc[HPB][DPL];
#pragma unroll
    for (int h = 0; h < HPB; h++) {
        m[h] = -__int_as_float(0x7f800000);
        l[h] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[h][i] = 0.0f;
    }
    for (int base = k0 + 32 * warp; base < k1; base += 128) {
        const int kp = base + lane;
        float s[HPB];
#pragma unroll
        for (int h = 0; h < HPB; h++) s[h] = 0.0f;
        if (kp < k1) {
            const int slot = ring > 0 ? kp % ring : kp;
            const u8* kr = kc + (long long)slot * row_bytes + (KT == KV_Q8_0 ? (long long)g * (HD / 32) * 34 : (long long)g * HD * (KT == KV_F32 ? 4 : 2));
#pragma unroll 4
            for (int d = 0; d < HD; d += 8) {
                float kv[8];
                load8<KT>(kr, d, kv);
#pragma unroll
                for (int h = 0; h < HPB; h++) {
                    const float4 a = *(const float4*)&qs[h * HD + d], b = *(const float4*)&qs[h * HD + d + 4];
                    s[h] = fmaf(a.x, kv[0], fmaf(a.y, kv[1], fmaf(a.z, kv[2], fmaf(a.w, kv[3], s[h]))));
                    s[h] = fmaf(b.x, kv[4], fmaf(b.y, kv[5], fmaf(b.z, kv[6], fmaf(b.w, kv[7], s[h]))));
                }
            }
        } else {
#pragma unroll
            for (int h = 0; h < HPB; h++) s[h] = -__int_as_float(0x7f800000);
        }
#pragma unroll
        for (int h = 0; h < HPB; h++) {
            float mn = fmaxf(m[h], warp_max(s[h]));
            float corr = expf(m[h] - mn);
            float pv = kp < k1 ? expf(s[h] - mn) : 0.0f;
            l[h] = l[h] * corr + warp_sum(pv);
            m[h] = mn;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[h][i] *= corr;
            ps[warp][h][lane] = pv;
        }
        __syncwarp();
        const int nk = min(32, k1 - base);
        // Keys base .. base + nk - 1 (fewer than a ring's slots: at most one wrap).
        const int slot0 = ring > 0 ? base % ring : base;
        auto vrow = [&](int j) {
            int sl = slot0 + j;
            if (ring > 0 && sl >= ring) sl -= ring;
            return vc + (long long)sl * row_bytes;
        };
        int j = 0;
        // Four keys at a time: their V values in one load each per lane, their probabilities in
        // one shared-memory read per head. Each accumulator still takes the keys one by one in
        // order (the same sums as one key at a time).
        for (; j + 4 <= nk; j += 4) {
            float vv[4][DPL];
#pragma unroll
            for (int u = 0; u < 4; u++) loadv<KT, DPL>(vrow(j + u), g * HD + lane * DPL, vv[u]);
#pragma unroll
            for (int h = 0; h < HPB; h++) {
                const float4 p4 = *(const float4*)&ps[warp][h][j];
                const float pj[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                for (int i = 0; i < DPL; i++) {
#pragma unroll
                    for (int u = 0; u < 4; u++) acc[h][i] = fmaf(pj[u], vv[u][i], acc[h][i]);
                }
            }
        }
        for (; j < nk; j++) {
            float vv[DPL];
            loadv<KT, DPL>(vrow(j), g * HD + lane * DPL, vv);
#pragma unroll
            for (int h = 0; h < HPB; h++) {
                float pj = ps[warp][h][j];
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[h][i] = fmaf(pj, vv[i], acc[h][i]);
            }
        }
        __syncwarp();
    }
    // Merge the four warps.
    __syncthreads();
#pragma unroll
    for (int h = 0; h < HPB; h++) {
        if (lane == 0) { wm[warp][h] = m[h]; wl[warp][h] = l[h]; }
#pragma unroll
        for (int i = 0; i < DPL; i++) wacc[warp][h * HD + lane * DPL + i] = acc[h][i];
    }
    __syncthreads();
    // part layout: [t][g][split][NREP][HD + 2] (acc..., m, l); this block's heads from h0.
    float* out = part + ((((long long)t * n_kv_head + g) * n_split + split) * NREP + h0) * (HD + 2);
    for (int i = threadIdx.x; i < HPB * HD; i += blockDim.x) {
        int h = i / HD;
        float M = fmaxf(fmaxf(wm[0][h], wm[1][h]), fmaxf(wm[2][h], wm[3][h]));
        float a = 0.0f;
        for (int w = 0; w < 4; w++) if (wl[w][h] > 0.0f) a += wacc[w][i] * expf(wm[w][h] - M);
        out[h * (HD + 2) + (i % HD)] = a;
    }
    for (int h = threadIdx.x; h < HPB; h += blockDim.x) {
        float M = fmaxf(fmaxf(wm[0][h], wm[1][h]), fmaxf(wm[2][h], wm[3][h]));
        float L = 0.0f;
        for (int w = 0; w < 4; w++) if (wl[w][h] > 0.0f) L += wl[w][h] * expf(wm[w][h] - M);
        out[h * (HD + 2) + HD] = M;
        out[h * (HD + 2) + HD + 1] = L;
    }
}

// attn_<NREP>_<HD>_<kv type>: all NREP heads per block; `_g4`: NREP / 4 (NREP a multiple of 4;
// otherwise NREP again, and the host launches it as groups of NREP).
#define ATTN_HPB4(NREP) ((NREP) % 4 == 0 ? (NREP) / 4 : (NREP))
#define ATTN_ENTRY(NREP, HD, KT, NAME)                                                                          \
    extern "C" __global__ void __launch_bounds__(128) attn_##NREP##_##HD##_##NAME(                            \
        const float* q, const u64* seqtab, int layer, long long row_bytes, const u32* pos, int n_swa,         \
        float scale, int n_kv_head, float* part) {                                                            \
        attn_partial_impl<NREP, HD, KT, NREP>(q, seqtab, layer, row_bytes, pos, n_swa, scale, n_kv_head, part); \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(128) attn_##NREP##_##HD##_##NAME##_g4(                       \
        const float* q, const u64* seqtab, int layer, long long row_bytes, const u32* pos, int n_swa,         \
        float scale, int n_kv_head, float* part) {                                                            \
        attn_partial_impl<NREP, HD, KT, ATTN_HPB4(NREP)>(q, seqtab, layer, row_bytes, pos, n_swa, scale,      \
                                                          n_kv_head, part);                                    \
    }
#define ATTN_TYPES(NREP, HD)                  \
    ATTN_ENTRY(NREP, HD, KV_F32, f32)         \
    ATTN_ENTRY(NREP, HD, KV_F16, f16)         \
    ATTN_ENTRY(NREP, HD, KV_BF16, bf16)       \
    ATTN_ENTRY(NREP, HD, KV_Q8_0, q8_0)
// One program per (NREP, HD): the backend compiles the variant a model needs (-DATTN_NREP=.. -DATTN_HD=..).
ATTN_TYPES(ATTN_NREP, ATTN_HD)
