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

// (The cache types KV_*: common.cuh.)
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
    pdl_trigger();  // attn_combine may be scheduled now (it waits for this grid)
    const int n_head = n_kv_head * NREP;
    const int p = (int)pos[t];
    u8 *kcm, *vcm;
    int ring;
    kv_layer(seqtab, t, layer, &kcm, &vcm, &ring);
    const u8* __restrict__ kc = kcm;
    const u8* __restrict__ vc = vcm;
    const int lo = n_swa > 0 ? max(0, p - n_swa + 1) : 0;
    const int n_keys = p - lo + 1;
    const int chunk = attn_chunk(n_keys, n_split);
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

// ---- Prompt attention on the tensor cores (f16 cache, one sequence per micro-batch) ----
//
// attn_tc: grid (n_kv_head, ceil(n_tok / TQ)), 4 warps. A block takes TQ = 64 / NREP
// consecutive tokens of the micro-batch and all NREP query heads of one KV head: 64 rows (row r =
// token r / NREP, head r % NREP), each warp 16 of them, and walks the union of their visible keys
// in tiles of 64 (K as rows, V transposed, both f16 in shared memory, keys past the last
// position zero), with `mma.sync.m16n8k16` f16 products and f32 accumulation:
// - S = Q K^T: each row of q scale (f32) is scaled by a power of two 2^S (its largest value below
//   2^14) and rounded to f16 hi; SPLIT (the accurate mode) adds lo = f16(v - hi) in a second
//   product into the same sums (v held to about 2^-22 of the row's largest value; K is the
//   cache's f16, exact). The sums times 2^-S are the scores.
// - online softmax per row in f32 (expf), masked keys (past the row's position, or out of its
//   window) at -Inf;
// - O += P V: P (in [0, 1]) rounded to f16 hi, SPLIT adds lo = f16(p - hi) (to 2^-24 absolute,
//   against l >= 1); V exact.
// The partials go out as attn_partial's with one split ([t][g][0][NREP][HD + 2]: acc, m, l), for
// attn_combine. The order of sums differs from attn_partial (the tensor cores' per 16 keys and
// dimensions, then the tile order), so the bits differ; the accurate mode's bound against the CPU
// holds either way (gpu.rs).
// (mma_f16: common.cuh.)
__device__ __forceinline__ u32 pack_h2(float x, float y) { return (u32)f2h(x) | ((u32)f2h(y) << 16); }
__device__ __forceinline__ u32 pack_h2_lo(float x, float y) {
    return (u32)f2h(x - h2f(f2h(x))) | ((u32)f2h(y - h2f(f2h(y))) << 16);
}

// Shared by attn_tc and attn_tcd (a warp's 16 query rows: this lane's rows a = gq and b = gq + 8).
//
// tc_q_row: this lane's values of one query row (at qr; zeros unless `ok`) times the softmax
// scale, in A-fragment order: per 16 dims kk, dims 2 tq, 2 tq + 1, then those + 8.
template <int NK>
__device__ __forceinline__ void tc_q_row(const float* qr, bool ok, float scale, int tq, float (&x)[NK][4]) {
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
        const float2 u = ok ? *(const float2*)(qr + 16 * kk + 2 * tq) : make_float2(0.0f, 0.0f);
        const float2 v = ok ? *(const float2*)(qr + 16 * kk + 8 + 2 * tq) : make_float2(0.0f, 0.0f);
        x[kk][0] = u.x * scale; x[kk][1] = u.y * scale;
        x[kk][2] = v.x * scale; x[kk][3] = v.y * scale;
    }
}

// tc_q_frags: the rows' values x (already times the softmax scale) into A fragments: each row
// times 2^S (its largest |value| below 2^14; the row's 4 lanes agree on it), hi f16, SPLIT also
// lo; down[ab] = 2^-S.
template <int NK, bool SPLIT>
__device__ __forceinline__ void tc_q_frags(float (&x)[2][NK][4], u32 (&qh)[NK][4], u32 (&ql)[SPLIT ? NK : 1][4],
                                           float (&down)[2]) {
#pragma unroll
    for (int ab = 0; ab < 2; ab++) {
        float m = 0.0f;
#pragma unroll
        for (int kk = 0; kk < NK; kk++)
#pragma unroll
            for (int e = 0; e < 4; e++) m = fmaxf(m, fabsf(x[ab][kk][e]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        const int S = f16_shift(__float_as_uint(m), 100);
        const float up = ldexpf(1.0f, S);
        down[ab] = ldexpf(1.0f, -S);
#pragma unroll
        for (int kk = 0; kk < NK; kk++)
#pragma unroll
            for (int e = 0; e < 4; e++) x[ab][kk][e] *= up;
    }
    // A fragments: reg 0 row a dims 2t, 2t+1; reg 1 row b; reg 2 row a dims + 8; reg 3 row b.
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
        qh[kk][0] = pack_h2(x[0][kk][0], x[0][kk][1]);
        qh[kk][1] = pack_h2(x[1][kk][0], x[1][kk][1]);
        qh[kk][2] = pack_h2(x[0][kk][2], x[0][kk][3]);
        qh[kk][3] = pack_h2(x[1][kk][2], x[1][kk][3]);
        if constexpr (SPLIT) {
            ql[kk][0] = pack_h2_lo(x[0][kk][0], x[0][kk][1]);
            ql[kk][1] = pack_h2_lo(x[1][kk][0], x[1][kk][1]);
            ql[kk][2] = pack_h2_lo(x[0][kk][2], x[0][kk][3]);
            ql[kk][3] = pack_h2_lo(x[1][kk][2], x[1][kk][3]);
        }
    }
}

// tc_scores: S = Q K^T for J tiles of 8 keys: tile j's keys are K's rows from `kr` (this lane's
// key gq and dims 2 tq, + 1 of the first tile's rows, stride KS) plus 8 j rows; SPLIT adds lo.
template <int J, int NK, int KS, bool SPLIT>
__device__ __forceinline__ void tc_scores(const u16* kr, const u32 (&qh)[NK][4], const u32 (&ql)[SPLIT ? NK : 1][4],
                                          float (&s)[J][4]) {
#pragma unroll
    for (int j = 0; j < J; j++) {
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        const u16* r = kr + 8 * j * KS;
#pragma unroll
        for (int kk = 0; kk < NK; kk++) {
            const u32 b0 = *(const u32*)(r + 16 * kk), b1 = *(const u32*)(r + 16 * kk + 8);
            mma_f16(s[j], qh[kk], b0, b1);
            if constexpr (SPLIT) mma_f16(s[j], ql[kk], b0, b1);
        }
    }
}

// tc_softmax: one step of the online softmax over J score tiles (already scaled, masked keys at
// -Inf; mx[ab] each row's largest score in this lane): the rows' maxima over their 4 lanes, the
// running (mrow, lsum) updated, the accumulators o rescaled, the scores turned into
// probabilities.
template <int J, int ND>
__device__ __forceinline__ void tc_softmax(float (&s)[J][4], float (&mx)[2], float (&mrow)[2], float (&lsum)[2],
                                           float (&o)[ND][4]) {
    const float NEG = -__int_as_float(0x7f800000);
    float corr[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int ab = 0; ab < 2; ab++) {
        mx[ab] = fmaxf(mx[ab], __shfl_xor_sync(0xffffffffu, mx[ab], 1));
        mx[ab] = fmaxf(mx[ab], __shfl_xor_sync(0xffffffffu, mx[ab], 2));
        const float mn = fmaxf(mrow[ab], mx[ab]);
        corr[ab] = mn == NEG ? 1.0f : expf(mrow[ab] - mn);
        mrow[ab] = mn;
    }
#pragma unroll
    for (int j = 0; j < J; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int ab = e >> 1;
            s[j][e] = mrow[ab] == NEG ? 0.0f : expf(s[j][e] - mrow[ab]);
            sum[ab] += s[j][e];
        }
#pragma unroll
    for (int ab = 0; ab < 2; ab++) {
        sum[ab] += __shfl_xor_sync(0xffffffffu, sum[ab], 1);
        sum[ab] += __shfl_xor_sync(0xffffffffu, sum[ab], 2);
        lsum[ab] = lsum[ab] * corr[ab] + sum[ab];
    }
#pragma unroll
    for (int n = 0; n < ND; n++) {
        o[n][0] *= corr[0]; o[n][1] *= corr[0];
        o[n][2] *= corr[1]; o[n][3] *= corr[1];
    }
}

// tc_p_frags: P's A fragment for 16 keys from score tiles s0 (keys 0-7) and s1 (keys 8-15): hi
// f16, SPLIT also lo.
template <bool SPLIT>
__device__ __forceinline__ void tc_p_frags(const float (&s0)[4], const float (&s1)[4], u32 (&ph)[4], u32 (&pl)[4]) {
    ph[0] = pack_h2(s0[0], s0[1]);
    ph[1] = pack_h2(s0[2], s0[3]);
    ph[2] = pack_h2(s1[0], s1[1]);
    ph[3] = pack_h2(s1[2], s1[3]);
    pl[0] = pl[1] = pl[2] = pl[3] = 0;
    if constexpr (SPLIT) {
        pl[0] = pack_h2_lo(s0[0], s0[1]);
        pl[1] = pack_h2_lo(s0[2], s0[3]);
        pl[2] = pack_h2_lo(s1[0], s1[1]);
        pl[3] = pack_h2_lo(s1[2], s1[3]);
    }
}

// tc_stage: keys kb .. kb + KT - 1 of KV head g into shared memory, K as rows (ks, stride KS), V
// transposed (vt, stride VS), f16; keys from `kend` on are zeros. The block's threads share it.
template <int HD, int KT, int KS, int VS>
__device__ __forceinline__ void tc_stage(u16* ks, u16* vt, const u8* kcm, const u8* vcm, int ring, long long row_bytes,
                                         int g, int kb, int kend) {
    for (int c = threadIdx.x; c < KT * (HD / 8); c += blockDim.x) {
        const int key = c / (HD / 8), d8 = (c % (HD / 8)) * 8, kp = kb + key;
        uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
        if (kp < kend) {
            const long long slot = ring > 0 ? kp % ring : kp;
            kv = *(const uint4*)(kcm + slot * row_bytes + 2LL * (g * HD + d8));
            vv = *(const uint4*)(vcm + slot * row_bytes + 2LL * (g * HD + d8));
        }
        *(uint4*)&ks[key * KS + d8] = kv;
        const u32 w[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            vt[(d8 + 2 * i) * VS + key] = (u16)(w[i] & 0xFFFF);
            vt[(d8 + 2 * i + 1) * VS + key] = (u16)(w[i] >> 16);
        }
    }
}

template <int NREP, int HD, bool SPLIT>
__device__ __forceinline__ void attn_tc_impl(const float* __restrict__ q, const u64* __restrict__ seqtab, int layer,
                                             long long row_bytes, const u32* __restrict__ pos, int n_swa, float scale,
                                             int n_kv_head, int n_tok, float* __restrict__ part) {
    constexpr int TQ = 64 / NREP, KT = 64, KS = HD + 8, VS = KT + 8, NK = HD / 16, ND = HD / 8;
    __shared__ __align__(16) u16 ks[KT * KS];
    __shared__ __align__(16) u16 vt[HD * VS];
    const int g = blockIdx.x, t0 = blockIdx.y * TQ;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    const int n_head = n_kv_head * NREP;
    int lo_min = 0x7fffffff, p_max = -1;
    for (int i = 0; i < TQ; i++) {
        const int t = t0 + i;
        if (t < n_tok) {
            const int p = (int)pos[t];
            lo_min = min(lo_min, n_swa > 0 ? max(0, p - n_swa + 1) : 0);
            p_max = max(p_max, p);
        }
    }
    u8 *kcm, *vcm;
    int ring;
    kv_layer(seqtab, t0, layer, &kcm, &vcm, &ring);
    // This lane's rows: a (16 warp + gq) and b (a + 8).
    int prow[2], lrow[2];
    u32 qh[NK][4], ql[SPLIT ? NK : 1][4];
    float down[2];
    {
        float x[2][NK][4];
#pragma unroll
        for (int ab = 0; ab < 2; ab++) {
            const int r = warp * 16 + gq + 8 * ab, t = t0 + r / NREP;
            const bool ok = t < n_tok;
            prow[ab] = ok ? (int)pos[t] : -1;
            lrow[ab] = ok ? (n_swa > 0 ? max(0, prow[ab] - n_swa + 1) : 0) : 1;
            tc_q_row<NK>(q + ((long long)(ok ? t : t0) * n_head + (long long)g * NREP + r % NREP) * HD, ok, scale,
                         tq, x[ab]);
        }
        tc_q_frags<NK, SPLIT>(x, qh, ql, down);
    }
    const float NEG = -__int_as_float(0x7f800000);
    float mrow[2] = {NEG, NEG}, lsum[2] = {0.0f, 0.0f};
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    for (int k0 = lo_min; k0 <= p_max; k0 += KT) {
        __syncthreads();  // the previous tile is consumed
        tc_stage<HD, KT, KS, VS>(ks, vt, kcm, vcm, ring, row_bytes, g, k0, p_max + 1);
        __syncthreads();
        float s[KT / 8][4];
        tc_scores<KT / 8, NK, KS, SPLIT>(ks + gq * KS + 2 * tq, qh, ql, s);
        // Scores, masks, the online softmax (rows a: elements 0, 1; b: 2, 3).
        float mx[2] = {NEG, NEG};
#pragma unroll
        for (int j = 0; j < KT / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int ab = e >> 1, kp = k0 + 8 * j + 2 * tq + (e & 1);
                const bool vis = kp >= lrow[ab] && kp <= prow[ab];
                s[j][e] = vis ? s[j][e] * down[ab] : NEG;
                mx[ab] = fmaxf(mx[ab], s[j][e]);
            }
        tc_softmax<KT / 8, ND>(s, mx, mrow, lsum, o);
        // O += P V, 16 keys per step: P's A fragment from the score tiles 2 kk and 2 kk + 1.
#pragma unroll
        for (int kk = 0; kk < KT / 16; kk++) {
            u32 ph[4], pl[4];
            tc_p_frags<SPLIT>(s[2 * kk], s[2 * kk + 1], ph, pl);
#pragma unroll
            for (int n = 0; n < ND; n++) {
                const u16* vr = vt + (8 * n + gq) * VS + 16 * kk + 2 * tq;
                const u32 b0 = *(const u32*)vr, b1 = *(const u32*)(vr + 8);
                mma_f16(o[n], ph, b0, b1);
                if constexpr (SPLIT) mma_f16(o[n], pl, b0, b1);
            }
        }
    }
    // Partials of rows a and b: dims 8 n + 2 tq, + 1; (m, l) from the lane with tq = 0.
#pragma unroll
    for (int ab = 0; ab < 2; ab++) {
        const int r = warp * 16 + gq + 8 * ab, t = t0 + r / NREP;
        if (t >= n_tok) continue;
        float* out = part + (((long long)t * n_kv_head + g) * NREP + r % NREP) * (HD + 2);
#pragma unroll
        for (int n = 0; n < ND; n++) *(float2*)(out + 8 * n + 2 * tq) = make_float2(o[n][2 * ab], o[n][2 * ab + 1]);
        if (tq == 0) {
            out[HD] = mrow[ab];
            out[HD + 1] = lsum[ab];
        }
    }
}
#define ATTN_TC_ENTRY(NREP, HD)                                                                                 \
    extern "C" __global__ void __launch_bounds__(128) attn_tc_##NREP##_##HD(                                  \
        const float* q, const u64* seqtab, int layer, long long row_bytes, const u32* pos, int n_swa,         \
        float scale, int n_kv_head, int n_tok, float* part) {                                                  \
        attn_tc_impl<NREP, HD, false>(q, seqtab, layer, row_bytes, pos, n_swa, scale, n_kv_head, n_tok, part); \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(128) attn_tc_##NREP##_##HD##_split(                          \
        const float* q, const u64* seqtab, int layer, long long row_bytes, const u32* pos, int n_swa,         \
        float scale, int n_kv_head, int n_tok, float* part) {                                                  \
        attn_tc_impl<NREP, HD, true>(q, seqtab, layer, row_bytes, pos, n_swa, scale, n_kv_head, n_tok, part);  \
    }

// ---- Batched decode attention on the tensor cores (f16 cache, any sequences) ----
//
// attn_tcd: grid (n_kv_head, n_split, n_tok), 4 warps, NREP <= 16. A block takes one split of
// one token's visible keys (the splits of attn_partial: its partials, its attn_combine) for the
// NREP query heads of one KV head: 16 rows (row r = head r; rows past NREP are zeros and are not
// written), the same in every warp. The block stages tiles of 64 keys as attn_tc does (K as
// rows, V transposed, f16 in shared memory, keys past the split zero); warp w takes keys 16 w ..
// 16 w + 15 of each tile with attn_tc's arithmetic (q scale in f16 hi, SPLIT adds lo; P hi, SPLIT
// adds lo; f32 sums, expf, masked keys at -Inf) and its own online softmax; the four warps'
// (acc, m, l) merge at the end as attn_partial's do. One token's 16 query heads fill one
// m16n8k16 row tile, so a decode batch, whose tokens each read a different sequence, goes to
// the tensor cores as a prompt does.
// CPA (`attn_tcd2_*`, the default; MUSER_ATTN_TCD=1 selects attn_tcd): the tiles staged by cp.async, every copy of a tile in
// flight at once (16 bytes each, keys past the split zero-filled), V kept as rows like K and read
// transposed by ldmatrix.trans: the same fragments, so the same bits as attn_tcd. attn_tcd's
// staging loads a tile in 8 rounds of dependent loads and writes V transposed 2 bytes at a time
// (16-way bank conflicts).
__device__ __forceinline__ u32 tcd_smem(const void* p) { return (u32)__cvta_generic_to_shared(p); }
// 16 bytes from global to shared memory, zeros where `bytes` is 0 (cp.async.cg with src-size).
__device__ __forceinline__ void tcd_cp16(void* dst, const void* src, u32 bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(tcd_smem(dst)), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tcd_cp_wait_all() {
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}
// Four 8x8 f16 matrices from shared memory, transposed (lanes 8i .. 8i + 7 give matrix i's rows).
__device__ __forceinline__ void tcd_ldm4t(u32 (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(tcd_smem(p)));
}

template <int NREP, int HD, bool SPLIT, bool CPA>
__device__ __forceinline__ void attn_tcd_impl(const float* __restrict__ q, const u64* __restrict__ seqtab, int layer,
                                              long long row_bytes, const u32* __restrict__ pos, int n_swa, float scale,
                                              int n_kv_head, float* __restrict__ part) {
    static_assert(NREP <= 16, "one row tile holds a KV head's query heads");
    constexpr int KT = 64, KS = HD + 8, VS = KT + 8, NK = HD / 16, ND = HD / 8;
    constexpr int VT = HD * VS > KT * KS ? HD * VS : KT * KS;  // V transposed, or as rows (CPA)
    constexpr int STAGE = KT * KS + VT, MERGE = 2 * 4 * 16 * HD;      // in u16
    __shared__ __align__(16) u16 smem[STAGE > MERGE ? STAGE : MERGE];
    __shared__ float wm[4][16], wl[4][16];
    u16* ks = smem;
    u16* vt = smem + KT * KS;
    const int g = blockIdx.x, split = blockIdx.y, t = blockIdx.z, n_split = gridDim.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    const int n_head = n_kv_head * NREP;
    pdl_trigger();  // attn_combine may be scheduled now (it waits for this grid)
    const int p = (int)pos[t];
    const int lo = n_swa > 0 ? max(0, p - n_swa + 1) : 0;
    const int n_keys = p - lo + 1;
    const int chunk = attn_chunk(n_keys, n_split);
    const int k0 = lo + split * chunk, k1 = min(p + 1, k0 + chunk);
    if (k0 >= k1) return;  // an empty split: attn_combine skips it (same arithmetic on pos)
    u8 *kcm, *vcm;
    int ring;
    kv_layer(seqtab, t, layer, &kcm, &vcm, &ring);
    u32 qh[NK][4], ql[SPLIT ? NK : 1][4];
    float down[2];
    {
        float x[2][NK][4];
#pragma unroll
        for (int ab = 0; ab < 2; ab++) {
            const int r = gq + 8 * ab;
            const bool ok = r < NREP;
            tc_q_row<NK>(q + ((long long)t * n_head + (long long)g * NREP + (ok ? r : 0)) * HD, ok, scale, tq, x[ab]);
        }
        tc_q_frags<NK, SPLIT>(x, qh, ql, down);
    }
    const float NEG = -__int_as_float(0x7f800000);
    float mrow[2] = {NEG, NEG}, lsum[2] = {0.0f, 0.0f};
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    for (int kb = k0; kb < k1; kb += KT) {
        __syncthreads();  // the previous tile is consumed
        if constexpr (CPA) {
            // 128 threads (the launch's), KT * HD / 8 copies of 16 bytes per matrix.
#pragma unroll
            for (int it = 0; it < KT * (HD / 8) / 128; it++) {
                const int c = threadIdx.x + 128 * it;
                const int key = c / (HD / 8), d8 = (c % (HD / 8)) * 8, kp = kb + key;
                const bool in = kp < k1;
                const int kq = in ? kp : kb;
                const long long slot = ring > 0 ? kq % ring : kq;
                const long long off = slot * row_bytes + 2LL * (g * HD + d8);
                tcd_cp16(&ks[key * KS + d8], kcm + off, in ? 16u : 0u);
                tcd_cp16(&vt[key * KS + d8], vcm + off, in ? 16u : 0u);
            }
            tcd_cp_wait_all();
        } else {
            tc_stage<HD, KT, KS, VS>(ks, vt, kcm, vcm, ring, row_bytes, g, kb, k1);
        }
        __syncthreads();
        // This warp's 16 keys: score tiles j = 0, 1 (keys 16 warp + 8 j + gq as B's columns).
        float s[2][4];
        tc_scores<2, NK, KS, SPLIT>(ks + (16 * warp + gq) * KS + 2 * tq, qh, ql, s);
        float mx[2] = {NEG, NEG};
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int ab = e >> 1, kp = kb + 16 * warp + 8 * j + 2 * tq + (e & 1);
                s[j][e] = kp < k1 ? s[j][e] * down[ab] : NEG;
                mx[ab] = fmaxf(mx[ab], s[j][e]);
            }
        tc_softmax<2, ND>(s, mx, mrow, lsum, o);
        // O += P V over this warp's 16 keys.
        u32 ph[4], pl[4];
        tc_p_frags<SPLIT>(s[0], s[1], ph, pl);
        if constexpr (CPA) {
            // V rows 16 warp .. + 15 (keys) at dims 8 n and 8 (n + 1): lanes 0-7 keys 0-7 and
            // lanes 8-15 keys 8-15 at 8 n, lanes 16-31 the same at 8 (n + 1).
            const u16* vr = vt + (16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1)) * KS + 8 * (lane >> 4);
#pragma unroll
            for (int n = 0; n < ND; n += 2) {
                u32 b[4];
                tcd_ldm4t(b, vr + 8 * n);
                mma_f16(o[n], ph, b[0], b[1]);
                if constexpr (SPLIT) mma_f16(o[n], pl, b[0], b[1]);
                mma_f16(o[n + 1], ph, b[2], b[3]);
                if constexpr (SPLIT) mma_f16(o[n + 1], pl, b[2], b[3]);
            }
        } else {
#pragma unroll
            for (int n = 0; n < ND; n++) {
                const u16* vr = vt + (8 * n + gq) * VS + 16 * warp + 2 * tq;
                const u32 b0 = *(const u32*)vr, b1 = *(const u32*)(vr + 8);
                mma_f16(o[n], ph, b0, b1);
                if constexpr (SPLIT) mma_f16(o[n], pl, b0, b1);
            }
        }
    }
    // Merge the four warps (attn_partial's merge): rows a = gq, b = gq + 8.
    __syncthreads();
    float* wacc = (float*)smem;  // [4][16][HD]
#pragma unroll
    for (int ab = 0; ab < 2; ab++) {
        const int r = gq + 8 * ab;
        if (tq == 0) { wm[warp][r] = mrow[ab]; wl[warp][r] = lsum[ab]; }
#pragma unroll
        for (int n = 0; n < ND; n++)
            *(float2*)(wacc + (warp * 16 + r) * HD + 8 * n + 2 * tq) = make_float2(o[n][2 * ab], o[n][2 * ab + 1]);
    }
    __syncthreads();
    // part layout: [t][g][split][NREP][HD + 2] (acc..., m, l).
    float* out = part + (((long long)t * n_kv_head + g) * n_split + split) * NREP * (HD + 2);
    for (int i = threadIdx.x; i < NREP * HD; i += blockDim.x) {
        const int h = i / HD;
        const float M = fmaxf(fmaxf(wm[0][h], wm[1][h]), fmaxf(wm[2][h], wm[3][h]));
        float a = 0.0f;
        for (int w = 0; w < 4; w++) if (wl[w][h] > 0.0f) a += wacc[(w * 16 + h) * HD + i % HD] * expf(wm[w][h] - M);
        out[h * (HD + 2) + (i % HD)] = a;
    }
    for (int h = threadIdx.x; h < NREP; h += blockDim.x) {
        const float M = fmaxf(fmaxf(wm[0][h], wm[1][h]), fmaxf(wm[2][h], wm[3][h]));
        float L = 0.0f;
        for (int w = 0; w < 4; w++) if (wl[w][h] > 0.0f) L += wl[w][h] * expf(wm[w][h] - M);
        out[h * (HD + 2) + HD] = M;
        out[h * (HD + 2) + HD + 1] = L;
    }
}
// One entry point of attn_tcd_impl: NAME its exported name, SPLIT the accurate mode's hi + lo
// form, CPA the cp.async staging (attn_tcd2).
#define ATTN_TCD_ONE(NAME, NREP, HD, SPLIT, CPA)                                                           \
    extern "C" __global__ void __launch_bounds__(128) NAME(                                               \
        const float* q, const u64* seqtab, int layer, long long row_bytes, const u32* pos, int n_swa,    \
        float scale, int n_kv_head, float* part) {                                                       \
        attn_tcd_impl<NREP, HD, SPLIT, CPA>(q, seqtab, layer, row_bytes, pos, n_swa, scale, n_kv_head, part); \
    }
#define ATTN_TCD_ENTRY(NREP, HD)                                                \
    ATTN_TCD_ONE(attn_tcd_##NREP##_##HD, NREP, HD, false, false)                \
    ATTN_TCD_ONE(attn_tcd_##NREP##_##HD##_split, NREP, HD, true, false)         \
    ATTN_TCD_ONE(attn_tcd2_##NREP##_##HD, NREP, HD, false, true)                \
    ATTN_TCD_ONE(attn_tcd2_##NREP##_##HD##_split, NREP, HD, true, true)

// One program per (NREP, HD): the backend compiles the variant a model needs (-DATTN_NREP=.. -DATTN_HD=..).
ATTN_TYPES(ATTN_NREP, ATTN_HD)
#define ATTN_TC(NREP, HD) ATTN_TC_ENTRY(NREP, HD)
ATTN_TC(ATTN_NREP, ATTN_HD)
#if ATTN_NREP <= 16
#define ATTN_TCD(NREP, HD) ATTN_TCD_ENTRY(NREP, HD)
ATTN_TCD(ATTN_NREP, ATTN_HD)
#endif
