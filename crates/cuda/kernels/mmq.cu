// ==== Products of many tokens on the int8 tensor cores, exact integer sums (Q4_K, Q6_K) ====
//
// For micro-batches of 2 or more tokens (batched decode, prompts), and for every token in the
// batch-invariant mode. The arithmetic is that of the x-stationary kernels (matvec.cu) on the
// tensor cores instead of dp4a:
// - xq_planes: each run of 32 activations of a token gets the power-of-two scale 2^(E-22) with
//   |x| < 2^E and becomes X = round(x 2^(22-E)), |X| <= 2^22, split into three byte planes
//   (two unsigned, the top one signed); the error is at most 2^-23 of the run's largest value,
//   the size of an f32 rounding of it. The run's f32 sum (a fixed butterfly) feeds Q4_K's mins.
// - mmq_*: the weight codes are the A operand and the digit planes the B operand of
//   mma.sync.m16n8k16 (s32 accumulators): sum q X over a run is exact in integers and becomes an
//   f32 with one rounding, then times the run's scale and the weights' d * scale.
// - Each (row, token) output is accumulated over the runs in column order; the columns are cut
//   into `ksplit` ranges chosen from the matrix shape alone, and mmq_reduce adds the ranges in
//   order. Nothing depends on how many tokens share the launch or which: a token's result is the
//   same in any batch.
//
// Fragments (PTX ISA, mma.m16n8k16 with .s8/.u8): groupID g = lane / 4, t = lane % 4;
//   A (16 x 16, row-major): reg 0 = row g, k 4t..4t+3; reg 1 = row g + 8, same k.
//   B (16 x 8, column-major): k 4t..4t+3 of column (token) g.
//   C (16 x 8, s32): c0, c1 = row g, tokens 2t, 2t + 1; c2, c3 = row g + 8, same tokens.

#define MMQ_WARPS 4      // warps per block, 16 rows each
#define MMQ_MAX_NT 8     // 8-token tiles per launch: 64 tokens

// Plane layout: planes[((run * 3 + p) * ntok_pad + tok) * 8 + w], 8 words (32 bytes) per run and
// token; xsc and xsum: [run * ntok_pad + tok]. Tokens ntok..ntok_pad - 1 are zero.
// grid (ceil(runs / 4), ntok_pad), 4 warps: one warp per run.
extern "C" __global__ void __launch_bounds__(128) xq_planes(const float* __restrict__ x, int cols, int ntok, int ntok_pad,
                                                            u8* __restrict__ planes, float* __restrict__ xsc,
                                                            float* __restrict__ xsum) {
    const int lane = threadIdx.x & 31;
    const int run = blockIdx.x * 4 + (threadIdx.x >> 5);
    const int tok = blockIdx.y;
    const int runs = cols >> 5;
    if (run >= runs) return;
    const float v = tok < ntok ? x[(long long)tok * cols + run * 32 + lane] : 0.0f;
    float m = fabsf(v), s = v;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        s += __shfl_xor_sync(0xffffffffu, s, o);
    }
    int E;
    frexpf(m, &E);     // m = f 2^E with f in [0.5, 1), so |x| < 2^E (E = 0 when m = 0)
    E = max(E, -100);  // values below 2^-100 count as 0
    const float up = __int_as_float((127 + 22 - E) << 23);  // 2^(22 - E), exact
    const int X = __float2int_rn(v * up);                   // |X| <= 2^22
#pragma unroll
    for (int p = 0; p < 3; p++)
        planes[(((long long)run * 3 + p) * ntok_pad + tok) * 32 + lane] = (u8)((X >> (8 * p)) & 0xFF);
    if (lane == 0) {
        xsc[(long long)run * ntok_pad + tok] = __int_as_float((127 - 22 + E) << 23);  // 2^(E - 22)
        xsum[(long long)run * ntok_pad + tok] = s;
    }
}

// d += A (s8 weights) x B (u8 or s8 digits).
__device__ __forceinline__ void mma_s8u8(int (&d)[4], u32 a0, u32 a1, u32 b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.u8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b));
}
__device__ __forceinline__ void mma_s8s8(int (&d)[4], u32 a0, u32 a1, u32 b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b));
}

// Byte i (0..11) of the 12 scale bytes of a Q4_K block held in three words.
__device__ __forceinline__ int kbyte(u32 y, u32 z, u32 w, int i) {
    const u32 v = i < 4 ? y : (i < 8 ? z : w);
    return (int)((v >> (8 * (i & 3))) & 0xFFu);
}
// Sub-block s's 6-bit scale and min (ggml's get_scale_min_k4).
__device__ __forceinline__ void q4k_sm(int s, u32 y, u32 z, u32 w, int* sc, int* mn) {
    if (s < 4) {
        *sc = kbyte(y, z, w, s) & 63;
        *mn = kbyte(y, z, w, s + 4) & 63;
    } else {
        *sc = (kbyte(y, z, w, s + 4) & 0xF) | ((kbyte(y, z, w, s - 4) >> 6) << 4);
        *mn = (kbyte(y, z, w, s + 4) >> 4) | ((kbyte(y, z, w, s) >> 6) << 4);
    }
}

// The B words of token tile `nt` for run `run`, plane p, half h (k 16h + 4t..).
__device__ __forceinline__ u32 bword(const u32* __restrict__ xq, int run, int p, int ntok_pad, int tok, int h, int t) {
    return __ldg(xq + (((long long)run * 3 + p) * ntok_pad + tok) * 8 + 4 * h + t);
}

// Where a block's sums go: straight to y when the columns are not split, else its range's slice
// of `part` ([split][ntok_total][rows]).
template <int NT>
__device__ __forceinline__ void mmq_store(const float (&acc)[NT][4], float* __restrict__ y, float* __restrict__ part,
                                          int rows, int r0, int tok0, int ntok, int ntok_total, int g, int t) {
    float* out = gridDim.y == 1 ? y : part + (long long)blockIdx.y * ntok_total * rows;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = r0 + g + (e >> 1) * 8, tok = nt * 8 + 2 * t + (e & 1);
            if (row < rows && tok < ntok) out[(long long)(tok0 + tok) * rows + row] = acc[nt][e];
        }
    }
}

// Q4_K (blocks of 144 bytes as in the file): run s of a block = weights 32s..32s+31 = nibble
// s % 2 of code bytes 32 (s / 2) + 0..31; w = d sc q - dmin m.
template <int NT>
__device__ __forceinline__ void mmq_q4_k_impl(const u8* __restrict__ W, const u32* __restrict__ xq,
                                              const float* __restrict__ xsc, const float* __restrict__ xsum,
                                              float* __restrict__ y, float* __restrict__ part, int rows, int cols,
                                              int tok0, int ntok, int ntok_pad, int ntok_total, int kb_per_split) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int r0 = (blockIdx.x * MMQ_WARPS + warp) * 16;
    const int nb = cols >> 8;
    const int kb0 = blockIdx.y * kb_per_split, kb1 = min(nb, kb0 + kb_per_split);
    const u8* Wa = W + (long long)min(r0 + g, rows - 1) * nb * 144;
    const u8* Wb = W + (long long)min(r0 + g + 8, rows - 1) * nb * 144;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nt][e] = 0.0f;
    for (int kb = kb0; kb < kb1; kb++) {
        const uint4 ha = __ldg((const uint4*)(Wa + kb * 144)), hb = __ldg((const uint4*)(Wb + kb * 144));
        const u32* qa = (const u32*)(Wa + kb * 144 + 16);
        const u32* qb = (const u32*)(Wb + kb * 144 + 16);
        const float da = h2f((u16)(ha.x & 0xFFFF)), dma = h2f((u16)(ha.x >> 16));
        const float db = h2f((u16)(hb.x & 0xFFFF)), dmb = h2f((u16)(hb.x >> 16));
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32 a_lo = __ldg(qa + 8 * j + t), a_hi = __ldg(qa + 8 * j + 4 + t);
            const u32 b_lo = __ldg(qb + 8 * j + t), b_hi = __ldg(qb + 8 * j + 4 + t);
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int s = 2 * j + hf, sh = 4 * hf;
                const u32 A0 = (a_lo >> sh) & 0x0F0F0F0Fu, A1 = (b_lo >> sh) & 0x0F0F0F0Fu;  // k 0..15
                const u32 A2 = (a_hi >> sh) & 0x0F0F0F0Fu, A3 = (b_hi >> sh) & 0x0F0F0F0Fu;  // k 16..31
                int sa, ma, sb, mb;
                q4k_sm(s, ha.y, ha.z, ha.w, &sa, &ma);
                q4k_sm(s, hb.y, hb.z, hb.w, &sb, &mb);
                const float dsa = da * (float)sa, dsb = db * (float)sb;
                const float mma_ = dma * (float)ma, mmb = dmb * (float)mb;
                const int run = kb * 8 + s;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int tok = tok0 + nt * 8 + g;
                    // sum q X = (S2 256 + S1) 256 + S0, accumulated in that order in the s32
                    // accumulators: |sum| <= 32 * 15 * 2^22 < 2^31.
                    int c[4] = {0, 0, 0, 0};
                    mma_s8s8(c, A0, A1, bword(xq, run, 2, ntok_pad, tok, 0, t));
                    mma_s8s8(c, A2, A3, bword(xq, run, 2, ntok_pad, tok, 1, t));
#pragma unroll
                    for (int e = 0; e < 4; e++) c[e] *= 256;
                    mma_s8u8(c, A0, A1, bword(xq, run, 1, ntok_pad, tok, 0, t));
                    mma_s8u8(c, A2, A3, bword(xq, run, 1, ntok_pad, tok, 1, t));
#pragma unroll
                    for (int e = 0; e < 4; e++) c[e] *= 256;
                    mma_s8u8(c, A0, A1, bword(xq, run, 0, ntok_pad, tok, 0, t));
                    mma_s8u8(c, A2, A3, bword(xq, run, 0, ntok_pad, tok, 1, t));
                    const long long si = (long long)run * ntok_pad + tok0 + nt * 8 + 2 * t;
                    const float2 sc2 = __ldg((const float2*)(xsc + si)), sm2 = __ldg((const float2*)(xsum + si));
                    acc[nt][0] += dsa * ((float)c[0] * sc2.x) - mma_ * sm2.x;
                    acc[nt][1] += dsa * ((float)c[1] * sc2.y) - mma_ * sm2.y;
                    acc[nt][2] += dsb * ((float)c[2] * sc2.x) - mmb * sm2.x;
                    acc[nt][3] += dsb * ((float)c[3] * sc2.y) - mmb * sm2.y;
                }
            }
        }
    }
    mmq_store<NT>(acc, y, part, rows, r0, tok0, ntok, ntok_total, g, t);
}

// Q6_K (structure of arrays: ql[nbt][128], qh[nbt][64], sc[nbt][16] int8, d[nbt] f16): run s of a
// block = quarter qt = s % 4 of half n = s / 4; weight l (0..31) has its low nibble in
// ql[64n + 32 (qt & 1) + l] (bits 4 (qt >> 1)..), its top two bits in qh[32n + l] (bits 2qt..),
// and the scale sc[8n + 2qt + l / 16]: each 16-weight half is summed on its own
// (256 S1 + S0 and S2 apart, |.| <= 16 * 32 * 65535 and 16 * 32 * 64) and joined in 64 bits.
template <int NT>
__device__ __forceinline__ void mmq_q6_k_impl(const u8* __restrict__ W, long long nbt, const u32* __restrict__ xq,
                                              const float* __restrict__ xsc, float* __restrict__ y,
                                              float* __restrict__ part, int rows, int cols, int tok0, int ntok,
                                              int ntok_pad, int ntok_total, int kb_per_split) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int r0 = (blockIdx.x * MMQ_WARPS + warp) * 16;
    const int nb = cols >> 8;
    const int kb0 = blockIdx.y * kb_per_split, kb1 = min(nb, kb0 + kb_per_split);
    const long long ba = (long long)min(r0 + g, rows - 1) * nb, bb = (long long)min(r0 + g + 8, rows - 1) * nb;
    const u8* QL = W;
    const u8* QH = W + nbt * 128;
    const signed char* SC = (const signed char*)(W + nbt * 192);
    const u16* D = (const u16*)(W + nbt * 208);
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nt][e] = 0.0f;
    for (int kb = kb0; kb < kb1; kb++) {
        const long long blka = ba + kb, blkb = bb + kb;
        const float da = h2f(__ldg(D + blka)), db = h2f(__ldg(D + blkb));
#pragma unroll
        for (int s = 0; s < 8; s++) {
            const int n = s >> 2, qt = s & 3;
            const int run = kb * 8 + s;
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int lo_off = 64 * n + 32 * (qt & 1) + 16 * hf + 4 * t, hi_off = 32 * n + 16 * hf + 4 * t;
                const u32 la = __ldg((const u32*)(QL + blka * 128 + lo_off)), lb = __ldg((const u32*)(QL + blkb * 128 + lo_off));
                const u32 qa = __ldg((const u32*)(QH + blka * 64 + hi_off)), qb = __ldg((const u32*)(QH + blkb * 64 + hi_off));
                const int nsh = 4 * (qt >> 1), hsh = 2 * qt;
                const u32 A0 = __vsub4(((la >> nsh) & 0x0F0F0F0Fu) | (((qa >> hsh) & 0x03030303u) << 4), 0x20202020u);
                const u32 A1 = __vsub4(((lb >> nsh) & 0x0F0F0F0Fu) | (((qb >> hsh) & 0x03030303u) << 4), 0x20202020u);
                const float dsa = da * (float)__ldg(SC + blka * 16 + 8 * n + 2 * qt + hf);
                const float dsb = db * (float)__ldg(SC + blkb * 16 + 8 * n + 2 * qt + hf);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int tok = tok0 + nt * 8 + g;
                    int c[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
                    mma_s8u8(c, A0, A1, bword(xq, run, 1, ntok_pad, tok, hf, t));
#pragma unroll
                    for (int e = 0; e < 4; e++) c[e] *= 256;
                    mma_s8u8(c, A0, A1, bword(xq, run, 0, ntok_pad, tok, hf, t));
                    mma_s8s8(ch, A0, A1, bword(xq, run, 2, ntok_pad, tok, hf, t));
                    const long long si = (long long)run * ntok_pad + tok0 + nt * 8 + 2 * t;
                    const float2 sc2 = __ldg((const float2*)(xsc + si));
                    float q[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) q[e] = __ll2float_rn((long long)ch[e] * 65536 + c[e]);
                    acc[nt][0] += dsa * (q[0] * sc2.x);
                    acc[nt][1] += dsa * (q[1] * sc2.y);
                    acc[nt][2] += dsb * (q[2] * sc2.x);
                    acc[nt][3] += dsb * (q[3] * sc2.y);
                }
            }
        }
    }
    mmq_store<NT>(acc, y, part, rows, r0, tok0, ntok, ntok_total, g, t);
}

#define MMQ_ENTRIES(NT)                                                                                                     \
    extern "C" __global__ void __launch_bounds__(MMQ_WARPS * 32) mmq_q4_k_##NT(                                             \
        const u8* W, const u32* xq, const float* xsc, const float* xsum, float* y, float* part, int rows, int cols,       \
        int tok0, int ntok, int ntok_pad, int ntok_total, int kb_per_split) {                                               \
        mmq_q4_k_impl<NT>(W, xq, xsc, xsum, y, part, rows, cols, tok0, ntok, ntok_pad, ntok_total, kb_per_split);       \
    }                                                                                                                       \
    extern "C" __global__ void __launch_bounds__(MMQ_WARPS * 32) mmq_q6_k_##NT(                                             \
        const u8* W, long long nbt, const u32* xq, const float* xsc, float* y, float* part, int rows, int cols, int tok0, \
        int ntok, int ntok_pad, int ntok_total, int kb_per_split) {                                                         \
        mmq_q6_k_impl<NT>(W, nbt, xq, xsc, y, part, rows, cols, tok0, ntok, ntok_pad, ntok_total, kb_per_split);        \
    }
MMQ_ENTRIES(1)
MMQ_ENTRIES(2)
MMQ_ENTRIES(3)
MMQ_ENTRIES(4)
MMQ_ENTRIES(5)
MMQ_ENTRIES(6)
MMQ_ENTRIES(7)
MMQ_ENTRIES(8)

// y[i] = part[0][i] + part[1][i] + ... in split order (n = ntok_total * rows).
extern "C" __global__ void mmq_reduce(const float* __restrict__ part, int ksplit, long long n, float* __restrict__ y) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float s = part[i];
        for (int k = 1; k < ksplit; k++) s += part[(long long)k * n + i];
        y[i] = s;
    }
}
