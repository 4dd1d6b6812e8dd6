// ==== Products of many tokens on the int8 tensor cores, exact integer sums (Q4_K, Q6_K) ====
//
// For micro-batches of 2 to 64 tokens (batched decode), and for every token in the batch-invariant
// mode. The idea of the x-stationary kernels (matvec.cu) on the tensor cores instead of dp4a:
// - xq_planes: each block of 256 activations of a token gets the power-of-two scale 2^(E-22) with
//   |x| < 2^E over the block and becomes X = round(x 2^(22-E)), |X| <= 2^22, split into three
//   byte planes (two unsigned, the top one signed); the error of a value is at most 2^(E-23), at
//   most 2^-22 of the block's largest value. Each run of 32 also gets its f32 sum (a fixed
//   order) for Q4_K's mins. A non-finite activation makes the block's scale NaN, so the products
//   that read it are NaN, as a float product would be.
// - mmq_*: the weight codes are the A operand and the digit planes the B operand of
//   mma.sync.m16n8k16 (s32 accumulators): per block and plane, sum_s sc_s sum q X is exact in
//   integers; the planes join in 64 bits and become an f32 with one rounding, then times d and the
//   block's scale.
// - Each (row, token) output is accumulated over the blocks in column order; the columns are cut
//   into `ksplit` ranges chosen from the matrix shape alone, and mmq_reduce adds the ranges in
//   order. Nothing depends on how many tokens share the launch or which: a token's result is the
//   same in any batch.
//
// Fragments (PTX ISA, mma.m16n8k16 with .s8/.u8): groupID g = lane / 4, t = lane % 4;
//   A (16 x 16, row-major): reg 0 = row g, k 4t..4t+3; reg 1 = row g + 8, same k.
//   B (16 x 8, column-major): k 4t..4t+3 of column (token) g.
//   C (16 x 8, s32): c0, c1 = row g, tokens 2t, 2t + 1; c2, c3 = row g + 8, same tokens.

// A block: 4 row groups of 16 rows, each with W = 1..4 warps (128 W threads) that take tiles
// 0..NT-1, NT..2NT-1, ... of the launch's tokens: the same weights, read once from HBM.
// NT: 8-token tiles per warp (1..4).

// Activation layout, per 256-column block kb and token (ntok_pad tokens, a multiple of 64; the pad
// ones zero):
//   xq:   16 P words per (kb, token, t) with P planes (3; 2 in the `MUSER_MMQ_PLANES=2` kernels):
//         word j = (run * P + p) * 2 + h holds plane p of the four values 32 run + 16 h + 4 t .. + 3
//         (t = 0..3, the B fragment of lane t), stored as
//         xq[(((kb * 4 P + j / 4) * ntok_pad + tok) * 4 + t) * 4 + j % 4], so that one 16-byte
//         load per lane fetches 512 contiguous bytes for 8 tokens;
//   xsc:  [kb * ntok_pad + tok], the block's scale 2^(E - 22) (two planes: 2^(E - 14); |x| < 2^E
//         over its 256 values);
//   xsum: [(kb * 8 + run) * ntok_pad + tok], the f32 sum of the run's 32 values.
// grid (cols / 256, ntok_pad), one warp per (block, token): lane l holds values 8l .. 8l + 7.
// P (2 or 3): the number of planes; with P = 2, X = round(x 2^(14-E)), |X| <= 2^14 (error at
// most 2^(E-15), 2^-14 of the block's largest value: the two-plane kernels), 32 P words per
// (kb, token, t), 4 P groups per kb.
extern "C" __global__ void __launch_bounds__(32) xq_planes(const float* __restrict__ x, int cols, int ntok, int ntok_pad,
                                                           u32* __restrict__ xq, float* __restrict__ xsc,
                                                           float* __restrict__ xsum, int P) {
    const int lane = threadIdx.x, kb = blockIdx.x, tok = blockIdx.y;
    float v[8];
    if (tok < ntok) {
        const float4 a = __ldg((const float4*)(x + (long long)tok * cols + kb * 256 + 8 * lane));
        const float4 b = __ldg((const float4*)(x + (long long)tok * cols + kb * 256 + 8 * lane) + 1);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = 0.0f;
    }
    float m = 0.0f, s = 0.0f;
    bool bad = false;
#pragma unroll
    for (int i = 0; i < 8; i++) { m = fmaxf(m, fabsf(v[i])); s += v[i]; bad |= !isfinite(v[i]); }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    bad = __any_sync(0xffffffffu, bad);
    // The run's sum: this lane's 8 in order, then its 4 lanes (a fixed butterfly).
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    int E;
    frexpf(m, &E);     // m = f 2^E with f in [0.5, 1), so |x| < 2^E (E = 0 when m = 0)
    E = bad ? 0 : max(E, -100);  // blocks below 2^-100: quantized in steps of 2^-122
    const int bits = 8 * P - 2;                               // 22 (three planes) or 14 (two)
    const float up = __int_as_float((127 + bits - E) << 23);  // 2^(bits - E), exact
    u32 w[3][2] = {{0, 0}, {0, 0}, {0, 0}};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int X = __float2int_rn(v[i] * up);  // |X| <= 2^bits
#pragma unroll
        for (int p = 0; p < 3; p++)
            if (p < P) w[p][i >> 2] |= (u32)((X >> (8 * p)) & 0xFF) << (8 * (i & 3));
    }
    // Values 8l .. 8l + 7 = run l / 4, half (l % 4) / 2, t = 2 (l % 2) and 2 (l % 2) + 1.
    const int run = lane >> 2, h = (lane & 3) >> 1, t0 = 2 * (lane & 1);
#pragma unroll
    for (int p = 0; p < 3; p++) {
        if (p >= P) break;
        const int j = (run * P + p) * 2 + h;
#pragma unroll
        for (int q = 0; q < 2; q++)
            xq[((((long long)kb * 4 * P + (j >> 2)) * ntok_pad + tok) * 4 + t0 + q) * 4 + (j & 3)] = w[p][q];
    }
    if ((lane & 3) == 0) xsum[((long long)kb * 8 + run) * ntok_pad + tok] = s;
    if (lane == 0)
        xsc[(long long)kb * ntok_pad + tok] = bad ? __int_as_float(0x7fc00000) : __int_as_float((127 - bits + E) << 23);  // 2^(E - bits)
}

// d += A (s8 weights) x B (u8 or s8 digits). Not volatile: pure functions of their operands, so
// the compiler may interleave them with the rest.
__device__ __forceinline__ void mma_s8u8(int (&d)[4], u32 a0, u32 a1, u32 b) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.u8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(b));
}
__device__ __forceinline__ void mma_s8s8(int (&d)[4], u32 a0, u32 a1, u32 b) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(b));
}
// The same over 32 k (m16n8k32): A regs a0, a1 = rows g, g + 8 at k 4t..4t+3, a2, a3 = the same
// rows at k 16 + 4t..; B regs b0 = k 4t..4t+3, b1 = k 16 + 4t.. of column g. One instruction for
// what two k16 ones do, the same exact integer sum (PTX ISA, mma.m16n8k32 .s8/.u8 fragments).
__device__ __forceinline__ void mma32_s8u8(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma32_s8s8(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// Plane p of NP planes of the digits: the top plane (p = NP - 1) is signed, the others not.
template <int NP, int p>
__device__ __forceinline__ void mma32_plane(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    if (p == NP - 1) mma32_s8s8(d, a0, a1, a2, a3, b0, b1);
    else mma32_s8u8(d, a0, a1, a2, a3, b0, b1);
}
template <int NP, int p>
__device__ __forceinline__ void mma_plane(int (&d)[4], u32 a0, u32 a1, u32 b) {
    if (p == NP - 1) mma_s8s8(d, a0, a1, b);
    else mma_s8u8(d, a0, a1, b);
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

// A load from global memory through the read-only path (G) or a plain one (shared memory).
template <bool G, typename T>
__device__ __forceinline__ T ld(const T* p) {
    if constexpr (G) return __ldg(p);
    else return *p;
}

// Where a warp's operands for one 256-column block live: the same code reads them from global
// memory (the one-stage kernels) or from the block's shared-memory stage (the staged kernels).
// xq: plane word 0 of (group jj = 0, the warp's first token, t = 0); group jj's words are
// jj * xq_jj further, token k's 16 k further. xsum: run 0 of the warp's first token (run r is r *
// xsum_run further). xsc: the warp's first token's block scale.
struct XSrc {
    const u32* xq;
    long long xq_jj;
    const float* xsum;
    long long xsum_run;
    const float* xsc;
};

// The 4 NP B words (runs 2i, 2i + 1; both halves; NP planes) of the block for 8-token tile nt
// of the warp: word j = (r * NP + p) * 2 + h with r = 0, 1 the pair's runs (a plane's two halves
// adjacent: the register pair of a k32 B operand).
template <bool G, int NP>
__device__ __forceinline__ void b_pair(const XSrc& x, int i, int nt, int g, int t, u32 (&b)[4 * NP]) {
#pragma unroll
    for (int c = 0; c < NP; c++) {
        const uint4 u = ld<G>((const uint4*)(x.xq + (NP * i + c) * x.xq_jj + ((nt * 8 + g) * 4 + t) * 4));
        b[4 * c] = u.x; b[4 * c + 1] = u.y; b[4 * c + 2] = u.z; b[4 * c + 3] = u.w;
    }
}

// The end of a 256-column block: T = (T2 256 + T1) 256 + T0 (three planes) or T1 256 + T0 (two)
// exactly (64 bits), one rounding to f32, times d (the row's) and the block scale (the token's),
// into the f32 sums.
template <int NP>
__device__ __forceinline__ float block_value(const int (&T)[NP]) {
    long long v;
    if constexpr (NP == 3) v = ((long long)T[2] * 65536 + (long long)T[1] * 256) + (long long)T[0];
    else v = (long long)T[1] * 256 + (long long)T[0];
    return __ll2float_rn(v);
}

template <int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nt][e] = 0.0f;
}

template <int NT, int NP>
__device__ __forceinline__ void zero_sums(int (&T)[NT][NP][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int p = 0; p < NP; p++)
#pragma unroll
            for (int e = 0; e < 4; e++) T[nt][p][e] = 0;
}

// T_p += sc c_p for the planes of one tile (sa: the scale of row g, sb: of row g + 8).
template <int NP>
__device__ __forceinline__ void add_scaled(int (&T)[NP][4], const int (&c)[NP][4], int sa, int sb) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int s_ = e < 2 ? sa : sb;
#pragma unroll
        for (int p = 0; p < NP; p++) T[p][e] += s_ * c[p][e];
    }
}

// The end of a 256-column block: acc += (d of the row) (the token's block scale) T.
template <int NT, bool G, int NP>
__device__ __forceinline__ void end_block(float (&acc)[NT][4], const int (&T)[NT][NP][4], float da, float db,
                                          const XSrc& x, int t) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const float2 s2 = ld<G>((const float2*)(x.xsc + nt * 8 + 2 * t));
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int Te[NP];
#pragma unroll
            for (int p = 0; p < NP; p++) Te[p] = T[nt][p][e];
            acc[nt][e] = fmaf((e < 2 ? da : db) * ((e & 1) ? s2.y : s2.x), block_value<NP>(Te), acc[nt][e]);
        }
    }
}

// Where a block's sums go: straight to y when the columns are not split, else its range's slice
// of `part` ([split][ntok_total][rows]). `tw`: the warp's first token within the launch.
template <int NT>
__device__ __forceinline__ void mmq_store(const float (&acc)[NT][4], float* __restrict__ y, float* __restrict__ part,
                                          int rows, int r0, int tok0, int tw, int ntok, int ntok_total, int g, int t) {
    float* out = gridDim.y == 1 ? y : part + (long long)blockIdx.y * ntok_total * rows;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = r0 + g + (e >> 1) * 8, tok = tw + nt * 8 + 2 * t + (e & 1);
            if (row < rows && tok < ntok) out[(long long)(tok0 + tok) * rows + row] = acc[nt][e];
        }
    }
}

// Q4_K (blocks of 144 bytes as in the file): run s of a block = weights 32s..32s+31 = nibble
// s % 2 of code bytes 32 (s / 2) + 0..31; w = d sc q - dmin m. Per block and plane p, the
// integer T_p = sum_s sc_s sum_{i in s} q_i X_i,p (|T_p| <= 8 * 63 * 32 * 15 * 255 < 2^26);
// sum w x = d 2^(E-22) (T2 2^16 + T1 2^8 + T0) - sum_s dmin m_s xsum_s.
// One block of the warp's MR tiles of 16 rows (w[mr][0]: row g's 144 bytes of tile mr, w[mr][1]:
// row g + 8's) and 8 NT tokens. The order of every sum of one (row, token) is fixed here (runs in
// order, then the block's end), whatever MR, NT or the kernel: every variant gives the same bits.
// SA (`MUSER_MMQ_SCALEA=1`): the 6-bit sub-block scale s = 8 s_hi + s_lo rides in the A operand
// instead: the packed codes times s_lo and times s_hi (q s <= 15 * 7 = 105 per byte, no carry into
// the next) feed two mma into two sums that run over the whole block, T = T_lo + 8 T_hi: the same
// exact integer as sum_s s (sum q X), with twice the mma and no multiply-add per run and tile.
template <int NT, int MR, bool G, bool SA = false, int NP = 3>
__device__ __forceinline__ void q4k_block(float (&acc)[MR][NT][4], const u8* (&w)[MR][2], const XSrc& x, int g,
                                          int t) {
    uint4 h[MR][2];
#pragma unroll
    for (int mr = 0; mr < MR; mr++)
#pragma unroll
        for (int ab = 0; ab < 2; ab++) h[mr][ab] = ld<G>((const uint4*)w[mr][ab]);
    int T[MR][NT][NP][4];
#pragma unroll
    for (int mr = 0; mr < MR; mr++) zero_sums<NT, NP>(T[mr]);
    int TH[SA ? MR : 1][SA ? NT : 1][NP][4];  // SA: the s_hi sums (T holds the s_lo ones)
    if constexpr (SA) {
#pragma unroll
        for (int mr = 0; mr < MR; mr++) zero_sums<SA ? NT : 1, NP>(TH[mr]);
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        u32 lo[MR][2], hi[MR][2];   // code words of k 0..15 and 16..31, rows a and b
        int sc[MR][2][2], mn[MR][2][2];  // [tile][run of the pair][row a, b]
#pragma unroll
        for (int mr = 0; mr < MR; mr++) {
#pragma unroll
            for (int ab = 0; ab < 2; ab++) {
                const u32* q = (const u32*)(w[mr][ab] + 16);
                lo[mr][ab] = ld<G>(q + 8 * j + t);
                hi[mr][ab] = ld<G>(q + 8 * j + 4 + t);
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                q4k_sm(2 * j + r, h[mr][0].y, h[mr][0].z, h[mr][0].w, &sc[mr][r][0], &mn[mr][r][0]);
                q4k_sm(2 * j + r, h[mr][1].y, h[mr][1].z, h[mr][1].w, &sc[mr][r][1], &mn[mr][r][1]);
            }
        }
        // SA: the codes times the scale halves, once for all token tiles: [tile][run][lo, hi][A0..A3].
        u32 AS[SA ? MR : 1][2][2][4];
        if constexpr (SA) {
#pragma unroll
            for (int mr = 0; mr < MR; mr++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int sh = 4 * r;
                    const u32 A[4] = {(lo[mr][0] >> sh) & 0x0F0F0F0Fu, (lo[mr][1] >> sh) & 0x0F0F0F0Fu,
                                      (hi[mr][0] >> sh) & 0x0F0F0F0Fu, (hi[mr][1] >> sh) & 0x0F0F0F0Fu};
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const u32 s_ = (u32)sc[mr][r][k & 1];  // A0, A2: row a; A1, A3: row b
                        AS[mr][r][0][k] = A[k] * (s_ & 7);
                        AS[mr][r][1][k] = A[k] * (s_ >> 3);
                    }
                }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            u32 b[4 * NP];
            b_pair<G, NP>(x, j, nt, g, t, b);
#pragma unroll
            for (int mr = 0; mr < MR; mr++) {
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    if constexpr (SA) {
#pragma unroll
                        for (int p = 0; p < NP; p++) {
                            const u32 b0 = b[(r * NP + p) * 2], b1 = b[(r * NP + p) * 2 + 1];
#pragma unroll
                            for (int hl = 0; hl < 2; hl++) {
                                int (&d)[4] = hl == 0 ? T[mr][nt][p] : TH[mr][nt][p];
                                const u32* a = AS[mr][r][hl];
                                if (p == NP - 1) mma32_s8s8(d, a[0], a[1], a[2], a[3], b0, b1);
                                else mma32_s8u8(d, a[0], a[1], a[2], a[3], b0, b1);
                            }
                        }
                        continue;
                    }
                    const int sh = 4 * r;
                    const u32 A0 = (lo[mr][0] >> sh) & 0x0F0F0F0Fu, A1 = (lo[mr][1] >> sh) & 0x0F0F0F0Fu;  // k 0..15
                    const u32 A2 = (hi[mr][0] >> sh) & 0x0F0F0F0Fu, A3 = (hi[mr][1] >> sh) & 0x0F0F0F0Fu;  // k 16..31
                    int c[NP][4];
#pragma unroll
                    for (int p = 0; p < NP; p++) c[p][0] = c[p][1] = c[p][2] = c[p][3] = 0;
                    mma32_plane<NP, 0>(c[0], A0, A1, A2, A3, b[r * 2 * NP], b[r * 2 * NP + 1]);
                    mma32_plane<NP, 1>(c[1], A0, A1, A2, A3, b[r * 2 * NP + 2], b[r * 2 * NP + 3]);
                    if constexpr (NP == 3) mma32_plane<NP, 2>(c[NP - 1], A0, A1, A2, A3, b[r * 6 + 4], b[r * 6 + 5]);
                    add_scaled<NP>(T[mr][nt], c, sc[mr][r][0], sc[mr][r][1]);
                }
            }
        }
        // The mins: acc -= dmin m_s xsum_s, runs in order.
#pragma unroll
        for (int r = 0; r < 2; r++) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const float2 xs = ld<G>((const float2*)(x.xsum + (2 * j + r) * x.xsum_run + nt * 8 + 2 * t));
#pragma unroll
                for (int mr = 0; mr < MR; mr++) {
                    const float ma = h2f((u16)(h[mr][0].x >> 16)) * (float)mn[mr][r][0];
                    const float mb = h2f((u16)(h[mr][1].x >> 16)) * (float)mn[mr][r][1];
                    acc[mr][nt][0] = fmaf(-ma, xs.x, acc[mr][nt][0]);
                    acc[mr][nt][1] = fmaf(-ma, xs.y, acc[mr][nt][1]);
                    acc[mr][nt][2] = fmaf(-mb, xs.x, acc[mr][nt][2]);
                    acc[mr][nt][3] = fmaf(-mb, xs.y, acc[mr][nt][3]);
                }
            }
        }
    }
    if constexpr (SA) {
#pragma unroll
        for (int mr = 0; mr < MR; mr++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int p = 0; p < NP; p++)
#pragma unroll
                    for (int e = 0; e < 4; e++) T[mr][nt][p][e] += 8 * TH[mr][nt][p][e];
    }
#pragma unroll
    for (int mr = 0; mr < MR; mr++) {
        const float da = h2f((u16)(h[mr][0].x & 0xFFFF)), db = h2f((u16)(h[mr][1].x & 0xFFFF));
        end_block<NT, G, NP>(acc[mr], T[mr], da, db, x, t);
    }
}

// Q6_K (structure of arrays: ql[nbt][128], qh[nbt][64], sc[nbt][16] int8, d[nbt] f16): run s of a
// block = quarter qt = s % 4 of half n = s / 4; weight l (0..31) has its low nibble in
// ql[64n + 32 (qt & 1) + l] (bits 4 (qt >> 1)..), its top two bits in qh[32n + l] (bits 2qt..),
// and the scale sc[8n + 2qt + l / 16]. Per block and plane, T_p = sum over the 16 halves of
// sc_h sum_{i in h} (q_i - 32) X_i,p (|T_p| <= 16 * 128 * 16 * 32 * 255 < 2^28);
// sum w x = d 2^(E-22) (T2 2^16 + T1 2^8 + T0). One block of the warp's MR tiles of rows (for tile
// mr and row ab = 0 (g), 1 (g + 8): its 128 + 64 + 16 bytes in r[mr][ab] and its d) and 8 NT
// tokens; as for Q4_K, the same order of sums for every variant.
struct Q6Row {
    const u8* ql;
    const u8* qh;
    const u8* sc;
    float d;
};
template <int NT, int MR, bool G, int NP = 3>
__device__ __forceinline__ void q6k_block(float (&acc)[MR][NT][4], Q6Row (&rw)[MR][2], const XSrc& x, int g,
                                          int t) {
    u32 scw[MR][2][4];
#pragma unroll
    for (int mr = 0; mr < MR; mr++)
#pragma unroll
        for (int ab = 0; ab < 2; ab++) {
            const uint4 v = ld<G>((const uint4*)rw[mr][ab].sc);
            scw[mr][ab][0] = v.x; scw[mr][ab][1] = v.y; scw[mr][ab][2] = v.z; scw[mr][ab][3] = v.w;
        }
    int T[MR][NT][NP][4];
#pragma unroll
    for (int mr = 0; mr < MR; mr++) zero_sums<NT, NP>(T[mr]);
#pragma unroll
    for (int i = 0; i < 4; i++) {  // run pairs (2i, 2i + 1)
        u32 A[MR][2][2][2];         // [tile][run of the pair][half][row a, b]
        int S[MR][2][2][2];         // scales, same indices
#pragma unroll
        for (int mr = 0; mr < MR; mr++) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int s = 2 * i + r, n = s >> 2, qt = s & 3;
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int lo_off = 64 * n + 32 * (qt & 1) + 16 * hf + 4 * t, hi_off = 32 * n + 16 * hf + 4 * t;
                    const int nsh = 4 * (qt >> 1), hsh = 2 * qt, si = 8 * n + 2 * qt + hf;
#pragma unroll
                    for (int ab = 0; ab < 2; ab++) {
                        const u32 l = ld<G>((const u32*)(rw[mr][ab].ql + lo_off));
                        const u32 q = ld<G>((const u32*)(rw[mr][ab].qh + hi_off));
                        A[mr][r][hf][ab] = __vsub4(((l >> nsh) & 0x0F0F0F0Fu) | (((q >> hsh) & 0x03030303u) << 4), 0x20202020u);
                        S[mr][r][hf][ab] = (int)(signed char)((scw[mr][ab][si >> 2] >> (8 * (si & 3))) & 0xFFu);
                    }
                }
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            u32 b[4 * NP];
            b_pair<G, NP>(x, i, nt, g, t, b);
#pragma unroll
            for (int mr = 0; mr < MR; mr++) {
#pragma unroll
                for (int r = 0; r < 2; r++) {
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        int c[NP][4];
#pragma unroll
                        for (int p = 0; p < NP; p++) c[p][0] = c[p][1] = c[p][2] = c[p][3] = 0;
                        const u32 a0 = A[mr][r][hf][0], a1 = A[mr][r][hf][1];
                        mma_plane<NP, 0>(c[0], a0, a1, b[(r * NP + 0) * 2 + hf]);
                        mma_plane<NP, 1>(c[1], a0, a1, b[(r * NP + 1) * 2 + hf]);
                        if constexpr (NP == 3) mma_plane<NP, 2>(c[NP - 1], a0, a1, b[(r * NP + 2) * 2 + hf]);
                        add_scaled<NP>(T[mr][nt], c, S[mr][r][hf][0], S[mr][r][hf][1]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int mr = 0; mr < MR; mr++) end_block<NT, G, NP>(acc[mr], T[mr], rw[mr][0].d, rw[mr][1].d, x, t);
}

// The warp's rows and tokens: row group warp % 4 of the block's 64 rows, tokens 8 NT (warp / 4)
// onwards of the block's.
#define MMQ_WARP_SETUP                                                                                                  \
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;                            \
    const int r0 = (blockIdx.x * 4 + (warp & 3)) * 16;                                                                  \
    const int tw = 8 * NT * (warp >> 2); /* this warp's tokens: tok0 + tw .. + 8 NT */                                  \
    const int nb = cols >> 8;                                                                                           \
    const int kb0 = blockIdx.y * kb_per_split, kb1 = min(nb, kb0 + kb_per_split);

// One-stage kernels: every warp reads its operands from global memory (through L1).
template <int NT>
__device__ __forceinline__ void mmq_q4_k_impl(const u8* __restrict__ W, const u32* __restrict__ xq,
                                              const float* __restrict__ xsc, const float* __restrict__ xsum,
                                              float* __restrict__ y, float* __restrict__ part, int rows, int cols,
                                              int tok0, int ntok, int ntok_pad, int ntok_total, int kb_per_split) {
    MMQ_WARP_SETUP
    const u8* Wa = W + (long long)min(r0 + g, rows - 1) * nb * 144;
    const u8* Wb = W + (long long)min(r0 + g + 8, rows - 1) * nb * 144;
    float acc[1][NT][4];
    zero_acc<NT>(acc[0]);
    for (int kb = kb0; kb < kb1; kb++) {
        const XSrc x = {xq + ((long long)kb * 12 * ntok_pad + tok0 + tw) * 16, (long long)ntok_pad * 16,
                        xsum + (long long)kb * 8 * ntok_pad + tok0 + tw, ntok_pad,
                        xsc + (long long)kb * ntok_pad + tok0 + tw};
        const u8* w[1][2] = {{Wa + kb * 144, Wb + kb * 144}};
        q4k_block<NT, 1, true>(acc, w, x, g, t);
    }
    mmq_store<NT>(acc[0], y, part, rows, r0, tok0, tw, ntok, ntok_total, g, t);
}

template <int NT>
__device__ __forceinline__ void mmq_q6_k_impl(const u8* __restrict__ W, long long nbt, const u32* __restrict__ xq,
                                              const float* __restrict__ xsc, float* __restrict__ y,
                                              float* __restrict__ part, int rows, int cols, int tok0, int ntok,
                                              int ntok_pad, int ntok_total, int kb_per_split) {
    MMQ_WARP_SETUP
    const long long ba = (long long)min(r0 + g, rows - 1) * nb, bb = (long long)min(r0 + g + 8, rows - 1) * nb;
    const u8* QL = W;
    const u8* QH = W + nbt * 128;
    const u8* SC = W + nbt * 192;
    const u16* D = (const u16*)(W + nbt * 208);
    float acc[1][NT][4];
    zero_acc<NT>(acc[0]);
    for (int kb = kb0; kb < kb1; kb++) {
        const long long blka = ba + kb, blkb = bb + kb;
        const XSrc x = {xq + ((long long)kb * 12 * ntok_pad + tok0 + tw) * 16, (long long)ntok_pad * 16, nullptr, 0,
                        xsc + (long long)kb * ntok_pad + tok0 + tw};
        Q6Row rw[1][2] = {{{QL + blka * 128, QH + blka * 64, SC + blka * 16, h2f(__ldg(D + blka))},
                           {QL + blkb * 128, QH + blkb * 64, SC + blkb * 16, h2f(__ldg(D + blkb))}}};
        q6k_block<NT, 1, true>(acc, rw, x, g, t);
    }
    mmq_store<NT>(acc[0], y, part, rows, r0, tok0, tw, ntok, ntok_total, g, t);
}

// ---- Staged kernels: the block's operands for a 256-column block go to shared memory ahead of use ----
//
// All warps of a block read the same activation planes (its tokens) and the warps of a row
// group the same weights; the one-stage kernels leave each warp waiting on its own loads (one
// 8-warp block per SM: nothing else to run meanwhile). Here the block copies the operands of
// block kb + MMQ_STAGES - 1 with cp.async while it computes block kb from shared memory. The
// arithmetic is q4k_block / q6k_block, the same as the one-stage kernels': the same bits.
// Stage layout (TB = the block's tokens = 8 NT x the warps across the tokens):
//   xq    4 NP groups (12; 8 with two planes) x TB tokens x 16 words (group jj, token k, lane t,
//         word w at (jj TB + k) 16 + 4t + w)
//   xsum  8 runs x TB floats (Q4_K only)
//   xsc   TB floats
//   W     64 rows x 144 bytes (Q4_K as in the file) or 208 (Q6_K: ql 128, qh 64, sc 16; d is read
//         from global memory)
#define MMQ_STAGES 3
__device__ __forceinline__ void cp16(void* dst, const void* src) {
    const u32 sa = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// Bytes of one stage (the launch sizes its dynamic shared memory as MMQ_STAGES of these).
__device__ __forceinline__ int mmq_stage_bytes(int TB, bool q6, int NP) { return TB * 256 * NP + (q6 ? 0 : TB * 32) + TB * 4 + 64 * (q6 ? 208 : 144); }

// Copy the operands of 256-column block kb into stage `st` (every thread of the block takes part).
template <bool Q6, int NP>
__device__ __forceinline__ void mmq_stage_load(u8* st, int TB, const u8* __restrict__ W, long long nbt,
                                               const u32* __restrict__ xq, const float* __restrict__ xsc,
                                               const float* __restrict__ xsum, int rows, int nb, int kb, int tok0,
                                               int ntok_pad, int rblk) {
    u32* Bs = (u32*)st;
    float* Xs = (float*)(st + TB * 256 * NP);
    float* Ss = Xs + (Q6 ? 0 : 8 * TB);
    u8* Ws = (u8*)(Ss + TB);
    const int tid = threadIdx.x, nth = blockDim.x;
    // No division by a run-time value here (each costs some twenty instructions, per copy):
    // a plane group is TB * 4 pieces of 16 bytes, at most one per thread (TB = 8 NT WT with WT
    // warps across the tokens out of blockDim.x / 32 = 4 WT / MR, and NT <= 4 / MR), so thread
    // tid copies piece tid of each of the 4 NP groups.
    const int per_group = TB * 4;
    if (tid < per_group) {
        const u32* src = xq + ((long long)kb * 4 * NP * ntok_pad + tok0) * 16 + tid * 4;
#pragma unroll
        for (int jj = 0; jj < 4 * NP; jj++) cp16(Bs + (jj * per_group + tid) * 4, src + (long long)jj * ntok_pad * 16);
    }
    // Run sums (8 runs) and scales: TB / 4 pieces each, the block's last threads.
    const int q4 = TB / 4, q = tid - (nth - q4);
    if (q >= 0) {
        if (!Q6) {
#pragma unroll
            for (int run = 0; run < 8; run++)
                cp16(Xs + run * TB + 4 * q, xsum + ((long long)kb * 8 + run) * ntok_pad + tok0 + 4 * q);
        }
        cp16(Ss + 4 * q, xsc + (long long)kb * ntok_pad + tok0 + 4 * q);
    }
    if (!Q6) {
        for (int p = tid; p < 64 * 9; p += nth) {
            const int row = p / 9, q = p - row * 9;
            const long long grow = min(rblk * 64 + row, rows - 1);
            cp16(Ws + row * 144 + 16 * q, W + (grow * nb + kb) * 144 + 16 * q);
        }
    } else {
        for (int p = tid; p < 64 * 13; p += nth) {
            const int row = p / 13, q = p - row * 13;
            const long long blk = (long long)min(rblk * 64 + row, rows - 1) * nb + kb;
            const u8* src = q < 8 ? W + blk * 128 + 16 * q : (q < 12 ? W + nbt * 128 + blk * 64 + 16 * (q - 8) : W + nbt * 192 + blk * 16);
            cp16(Ws + row * 208 + 16 * q, src);
        }
    }
}

// The column ranges of a split launch added by its last block (`cnt` set; otherwise mmq_reduce
// does it in a launch of its own): every block writes its range's partial sums (mmq_store), and
// the last of a (row block, grid layer)'s gridDim.y blocks to finish (a counter per pair, reset
// by that block for the next launch) adds the ranges in order, part[0] + part[1] + ..., as
// mmq_reduce does: the same bits. `part` is the matrix's (range 0), `tok0`/`ntok` the block's
// first token and the launch's tokens from it, `tb` its tokens.
// Every block of the launch must reach this: a block that did not would leave the counter short.
__device__ __forceinline__ void mmq_split_sum(const float* __restrict__ part, float* __restrict__ y, unsigned* cnt,
                                              int rows, int rblk, int tok0, int ntok, int ntok_total, int tb) {
    __shared__ bool last;
    __threadfence();  // this block's partial sums, visible to the block that adds them
    __syncthreads();
    const int c = blockIdx.z * gridDim.x + blockIdx.x;
    if (threadIdx.x == 0) last = atomicAdd(&cnt[c], 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const long long n = (long long)ntok_total * rows;
    const int nt = min(tb, ntok);
    for (int i = threadIdx.x; i < 64 * nt; i += blockDim.x) {
        const int row = rblk * 64 + (i & 63), tok = tok0 + (i >> 6);
        if (row >= rows) continue;
        const long long o = (long long)tok * rows + row;
        float s = __ldcg(part + o);
        for (int k = 1; k < (int)gridDim.y; k++) s += __ldcg(part + k * n + o);
        y[o] = s;
    }
    if (threadIdx.x == 0) cnt[c] = 0u;
}

// MR tiles of 16 rows per warp: 4 / MR warps cover the block's 64 rows, the others take further
// tokens; with MR = 2 every activation fragment read from shared memory serves twice the rows.
// S: stages in flight (MMQ_STAGES; 2 in the kernels that fit two blocks per SM).
template <int NT, int MR, bool Q6, bool SA = false, int NP = 3, int S = MMQ_STAGES>
__device__ __forceinline__ void mmq_staged_impl(const u8* __restrict__ W, long long nbt, const u32* __restrict__ xq,
                                                const float* __restrict__ xsc, const float* __restrict__ xsum,
                                                float* __restrict__ y, float* __restrict__ part, int rows, int cols,
                                                int tok0, int ntok, int ntok_pad, int ntok_total, int kb_per_split,
                                                const u8* __restrict__ W2, float* __restrict__ y2, unsigned* cnt) {
    extern __shared__ __align__(16) u8 mmq_smem[];
    // A pair launch (W2 set: two matrices of one shape and format, the same activations, e.g. the
    // FFN's gate and up): the second half of the row blocks computes W2 into y2 (its column
    // ranges after W's in `part`), each block exactly as a launch of its matrix alone would.
    int rblk = blockIdx.x;
    const int rbs = (rows + 63) >> 6;
    if (W2 != nullptr && rblk >= rbs) {
        rblk -= rbs;
        W = W2;
        y = y2;
        part += (long long)gridDim.y * ntok_total * rows;
    }
    constexpr int RG = 4 / MR;  // warps across the block's rows
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int rb = (warp % RG) * 16 * MR;          // the warp's first row within the block
    const int r0 = rblk * 64 + rb;
    const int tw = 8 * NT * (warp / RG);           // the warp's first token within the block
    const int nb = cols >> 8;
    const int kb0 = blockIdx.y * kb_per_split, kb1 = min(nb, kb0 + kb_per_split);
    const int TB = 8 * NT * ((blockDim.x >> 5) / RG);
    // Grid layer z: the launch's tokens TB z onwards (one launch for many tokens).
    tok0 += blockIdx.z * TB;
    ntok -= blockIdx.z * TB;
    const int sb = mmq_stage_bytes(TB, Q6, NP);
    const u16* D = (const u16*)(W + nbt * 208);
    long long bd[MR][2];  // Q6_K: the d index of rows g and g + 8 of each tile (block 0)
#pragma unroll
    for (int mr = 0; mr < MR; mr++)
#pragma unroll
        for (int ab = 0; ab < 2; ab++) bd[mr][ab] = (long long)min(r0 + 16 * mr + 8 * ab + g, rows - 1) * nb;
    float acc[MR][NT][4];
#pragma unroll
    for (int mr = 0; mr < MR; mr++) zero_acc<NT>(acc[mr]);
    // Prologue: the first S - 1 blocks in flight (a group is committed even when empty,
    // so that group i always holds block kb0 + i).
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (kb0 + s < kb1)
            mmq_stage_load<Q6, NP>(mmq_smem + s * sb, TB, W, nbt, xq, xsc, xsum, rows, nb, kb0 + s, tok0, ntok_pad, rblk);
        cp_commit();
    }
    for (int kb = kb0; kb < kb1; kb++) {
        const int i = kb - kb0;
        cp_wait<S - 2>();  // block kb's group has landed (this thread's copies) ...
        __syncthreads();            // ... everyone's; and every warp is done with stage (i - 1)
        if (kb + S - 1 < kb1)
            mmq_stage_load<Q6, NP>(mmq_smem + ((i + S - 1) % S) * sb, TB, W, nbt, xq, xsc, xsum, rows, nb, kb + S - 1,
                                   tok0, ntok_pad, rblk);
        cp_commit();
        const u8* st = mmq_smem + (i % S) * sb;
        const u32* Bs = (const u32*)st;
        const float* Xs = (const float*)(st + TB * 256 * NP);
        const float* Ss = Xs + (Q6 ? 0 : 8 * TB);
        const u8* Ws = (const u8*)(Ss + TB);
        const XSrc x = {Bs + tw * 16, (long long)TB * 16, Xs + tw, TB, Ss + tw};
        if (!Q6) {
            const u8* w[MR][2];
#pragma unroll
            for (int mr = 0; mr < MR; mr++)
#pragma unroll
                for (int ab = 0; ab < 2; ab++) w[mr][ab] = Ws + (rb + 16 * mr + 8 * ab + g) * 144;
            q4k_block<NT, MR, false, SA, NP>(acc, w, x, g, t);
        } else {
            Q6Row rw[MR][2];
#pragma unroll
            for (int mr = 0; mr < MR; mr++)
#pragma unroll
                for (int ab = 0; ab < 2; ab++) {
                    const u8* base = Ws + (rb + 16 * mr + 8 * ab + g) * 208;
                    rw[mr][ab] = {base, base + 128, base + 192, h2f(__ldg(D + bd[mr][ab] + kb))};
                }
            q6k_block<NT, MR, false, NP>(acc, rw, x, g, t);
        }
    }
    cp_wait<0>();
#pragma unroll
    for (int mr = 0; mr < MR; mr++) mmq_store<NT>(acc[mr], y, part, rows, r0 + 16 * mr, tok0, tw, ntok, ntok_total, g, t);
    if (gridDim.y > 1 && cnt != nullptr) mmq_split_sum(part, y, cnt, rows, rblk, tok0, ntok, ntok_total, TB);
}

// Blocks of up to 512 threads (4 warps per row group) for 1 or 2 tiles per warp, 256 for 3 or 4.
#define MMQ_THREADS(NT) ((NT) <= 2 ? 512 : 256)

// A staged entry point of Q4_K / Q6_K: BOUNDS its launch bounds in parentheses, the rest
// mmq_staged_impl's template arguments (the last two parameters, W2 and y2: the pair launch).
#define MMQ_STAGED_Q4(NAME, BOUNDS, NT, MR, SA, NP, S)                                                                \
    extern "C" __global__ void __launch_bounds__ BOUNDS NAME(                                                         \
        const u8* W, const u32* xq, const float* xsc, const float* xsum, float* y, float* part, int rows, int cols,     \
        int tok0, int ntok, int ntok_pad, int ntok_total, int kb_per_split, const u8* W2, float* y2, unsigned* cnt) {   \
        mmq_staged_impl<NT, MR, false, SA, NP, S>(W, 0, xq, xsc, xsum, y, part, rows, cols, tok0, ntok, ntok_pad,      \
                                                  ntok_total, kb_per_split, W2, y2, cnt);                               \
    }
#define MMQ_STAGED_Q6(NAME, BOUNDS, NT, MR, NP, S)                                                                     \
    extern "C" __global__ void __launch_bounds__ BOUNDS NAME(                                                         \
        const u8* W, long long nbt, const u32* xq, const float* xsc, float* y, float* part, int rows, int cols,         \
        int tok0, int ntok, int ntok_pad, int ntok_total, int kb_per_split, const u8* W2, float* y2, unsigned* cnt) {   \
        mmq_staged_impl<NT, MR, true, false, NP, S>(W, nbt, xq, xsc, nullptr, y, part, rows, cols, tok0, ntok,         \
                                                    ntok_pad, ntok_total, kb_per_split, W2, y2, cnt);                   \
    }

// The one-stage kernels and the staged ones (`mmq_s_*`), NT tiles of 8 tokens per warp.
#define MMQ_ENTRIES(NT)                                                                                                 \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS(NT)) mmq_q4_k_##NT(                                         \
        const u8* W, const u32* xq, const float* xsc, const float* xsum, float* y, float* part, int rows, int cols,     \
        int tok0, int ntok, int ntok_pad, int ntok_total, int kb_per_split) {                                           \
        mmq_q4_k_impl<NT>(W, xq, xsc, xsum, y, part, rows, cols, tok0, ntok, ntok_pad, ntok_total, kb_per_split);       \
    }                                                                                                                   \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS(NT)) mmq_q6_k_##NT(                                         \
        const u8* W, long long nbt, const u32* xq, const float* xsc, float* y, float* part, int rows, int cols, int tok0, \
        int ntok, int ntok_pad, int ntok_total, int kb_per_split) {                                                     \
        mmq_q6_k_impl<NT>(W, nbt, xq, xsc, y, part, rows, cols, tok0, ntok, ntok_pad, ntok_total, kb_per_split);        \
    }                                                                                                                   \
    MMQ_STAGED_Q4(mmq_s_q4_k_##NT, (MMQ_THREADS(NT)), NT, 1, false, 3, MMQ_STAGES)                                     \
    MMQ_STAGED_Q6(mmq_s_q6_k_##NT, (MMQ_THREADS(NT)), NT, 1, 3, MMQ_STAGES)
MMQ_ENTRIES(1)
MMQ_ENTRIES(2)
MMQ_ENTRIES(3)
MMQ_ENTRIES(4)

// Staged, two tiles of 16 rows per warp (`MUSER_MMQ_MR=2`): 2 warps across the rows, up to 4
// across the tokens (256 threads), 1 or 2 token tiles per warp.
MMQ_STAGED_Q4(mmq_s2_q4_k_1, (256), 1, 2, false, 3, MMQ_STAGES)
MMQ_STAGED_Q4(mmq_s2_q4_k_2, (256), 2, 2, false, 3, MMQ_STAGES)
MMQ_STAGED_Q6(mmq_s2_q6_k_1, (256), 1, 2, 3, MMQ_STAGES)
MMQ_STAGED_Q6(mmq_s2_q6_k_2, (256), 2, 2, 3, MMQ_STAGES)

// Staged Q4_K with the sub-block scales in the A operand (`MUSER_MMQ_SCALEA=1`, q4k_block SA).
MMQ_STAGED_Q4(mmq_sa_q4_k_1, (MMQ_THREADS(1)), 1, 1, true, 3, MMQ_STAGES)
MMQ_STAGED_Q4(mmq_sa_q4_k_2, (MMQ_THREADS(2)), 2, 1, true, 3, MMQ_STAGES)
MMQ_STAGED_Q4(mmq_sa_q4_k_3, (MMQ_THREADS(3)), 3, 1, true, 3, MMQ_STAGES)
MMQ_STAGED_Q4(mmq_sa_q4_k_4, (MMQ_THREADS(4)), 4, 1, true, 3, MMQ_STAGES)

// Staged, two digit planes (`MUSER_MMQ_PLANES=2`: activations to within 2^-14 of their block's largest
// value, two thirds of the mma and multiply-adds of three planes).
#define MMQ_ENTRIES_P2(NT)                                                                                              \
    MMQ_STAGED_Q4(mmq_p2_q4_k_##NT, (MMQ_THREADS(NT)), NT, 1, false, 2, MMQ_STAGES)                                    \
    MMQ_STAGED_Q6(mmq_p2_q6_k_##NT, (MMQ_THREADS(NT)), NT, 1, 2, MMQ_STAGES)
MMQ_ENTRIES_P2(1)
MMQ_ENTRIES_P2(2)
MMQ_ENTRIES_P2(3)
MMQ_ENTRIES_P2(4)

// Two planes, two stages, two blocks per SM (`MUSER_MMQ_PLANES=2 MUSER_MMQ_OCC=2`): 16 warps per
// SM instead of 8 to hide the latencies the kernels wait on (at most 128 registers, 2 x 89 KB of
// shared memory at 64 tokens of Q4_K); 256-thread blocks only (3 or 4 token tiles per warp).
MMQ_STAGED_Q4(mmq_p2o_q4_k_3, (256, 2), 3, 1, false, 2, 2)
MMQ_STAGED_Q4(mmq_p2o_q4_k_4, (256, 2), 4, 1, false, 2, 2)
MMQ_STAGED_Q6(mmq_p2o_q6_k_3, (256, 2), 3, 1, 2, 2)
MMQ_STAGED_Q6(mmq_p2o_q6_k_4, (256, 2), 4, 1, 2, 2)

// y[i] = part[0][i] + part[1][i] + ... in split order (n = ntok_total * rows).
extern "C" __global__ void mmq_reduce(const float* __restrict__ part, int ksplit, long long n, float* __restrict__ y) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float s = part[i];
        for (int k = 1; k < ksplit; k++) s += part[(long long)k * n + i];
        y[i] = s;
    }
}
