// ==== Products of 9 to 64 tokens straight from Q4_K on the f16 tensor cores (`--mode fast`) ====
//
// Batched decode multiplies each weight matrix by a few tokens: too few for a dequantized f16
// copy to pay (2 bytes read per weight, against Q4_K's 0.5625), too many for the one-token
// kernels. Here the weights stay Q4_K in HBM and the products run on mma.sync.m16n8k16 (f16
// operands, f32 accumulation), with nothing rounded but the activations:
//
//   A (weights): sc q, the sub-block scale times the 4-bit code, an integer of at most 63 x 15 =
//     945, exact in f16. Made from the code bytes without a conversion: (0x6400 | q) is the half
//     1024 + q, and one fma.rn.f16x2 gives sc (1024 + q) - 1024 sc = sc q exactly (the high
//     nibbles: (0x6400 | 16 q) = 1024 + 16 q, times sc / 16, minus 64 sc).
//   B (activations): x16_split's halves of each token, x 2^B_t rounded to f16 (gemm16's fast
//     form; call them x^).
//   Per 256-column block (a Q4_K block) and (row, token): T = sum_k sc q x^ on the tensor cores,
//     U = sum_s m_s (h_s + l_s) with h_s + l_s = (sum of sub-block s's 32 x^) / 32 in two halves
//     (x16_runsums), one more mma; then acc += d T, acc += (-32 dmin) U, in that order, in f32.
//   y = acc 2^-B_t (with one column range), or the ranges' acc in part[z][t][rows] that
//   qmma_reduce adds in order and scales.
// Against the exact weights times x^, the only errors are the f32 sums (inside the mma and
// after) and the run sums' 22 bits. Nothing depends on which other tokens share the launch: a
// token's result is the same in any batch (its column ranges come from the matrix shape).
//
// Fragments (mma.m16n8k16 .f16, PTX ISA; g = lane / 4, t = lane % 4): A a0 = row g, k 2t..2t+1;
// a1 = row g + 8; a2 = row g, k 2t+8..2t+9; a3 = row g + 8, k 2t+8..; B b0 = k 2t..2t+1 of column
// (token) g, b1 = k 2t+8..; D d0, d1 = row g, tokens 2t, 2t + 1; d2, d3 = row g + 8.
// The k order inside one mma is ours to choose (the same for A and B): for the 64 weights of code
// bytes 32c..32c+31 of a block (sub-block 2c in the low nibbles, 2c + 1 in the high), thread t
// takes bytes 8t..8t+7, and k16 step e of a sub-block takes bytes 8t + 4e .. +3: slots 2t, 2t+1
// hold weights j, j+1 and slots 2t+8, 2t+9 weights j+2, j+3 (j = 8t + 4e), so B is x^[j..j+3] of
// the sub-block, and the two steps of a sub-block one 16-byte load of x^[8t..8t+7].
//
// A block: WR row warps of 32 rows (two 16-row tiles each) times WT token warps of NT 8-token
// tiles; the 32 WR rows' weights of one Q4_K block column, the tokens' x^ and run sums for it
// make a stage, copied 16 bytes at a time by every thread (cp.async; `stages - 1` steps in
// flight). A step: its copies land, a barrier, the stage freed by the previous step is refilled,
// each warp decodes its rows' scales and mins (a lane a row) into its constants and computes.
// (One bulk copy per row and token, cp.async.bulk, issued them one at a time: 5 to 10
// times slower, H200 2026-11-30.)

#define QM_WROW 160   // bytes per weight row in a stage: 144, padded so a quad's loads of rows g = 0..3 miss each other's banks
#define QM_XROW 576   // bytes per token row of x^ in a stage: 512, padded so tokens g and g + 1 fall in opposite bank halves
#define QM_XSROW 32   // bytes per token of run sums (8 sub-blocks, (h, l) halves)
#define QM_CROW 112   // bytes per row of decoded constants: 4 x (sc2 lo, -1024 sc lo, sc2 hi / 16, -64 sc hi), 8 x (m, m), (d, -32 dmin), 8 unused (16-byte rows)
#define QM_MAX_STAGES 4

__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
    u32 d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
// Byte i of w (a value 0..63) as the half pair (v, v): (0x6400 | v) is 1024 + v.
__device__ __forceinline__ u32 qm_pair(u32 w, int i) {
    const u32 v = __byte_perm(w, 0, 0x4040 | (i << 8) | i) | 0x64006400u;
    return hsub2(v, 0x64006400u);
}

// Shared memory, in order: `stages` stages (a step's rb weight rows of QM_WROW bytes, and but
// for XREG its ntok tokens of QM_XROW bytes of x^ and QM_XSROW of run sums), XREG's two buffers of
// the tokens' x^ and run sums, then each warp's decoded constants for the step (32 rows of
// QM_CROW bytes): lib.rs's qmma sizes it the same way.

// 16 bytes from global to shared memory without registers (cp.async, sm_80), in this thread's
// current group; the group closed by cp_async_commit; wait until at most stages - 2 of this
// thread's groups are pending (stages 2..QM_MAX_STAGES).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_stages(int stages) {
    switch (stages) {
        case 2: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
        case 3: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
        default: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    }
}

// The run sums of x16_split's halves: for token t and sub-block s (32 columns), h + l = (sum of the
// 32 halves in order, in f32) / 32, h = f16 of it, l = f16 of the rest; out[t cols/32 + s] =
// h | l << 16. A thread per (token, sub-block), grid-strided.
extern "C" __global__ void x16_runsums(const u16* __restrict__ xh, long long ldx, int n, int cols, u32* __restrict__ out) {
    const int runs = cols >> 5;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)n * runs; i += (long long)gridDim.x * blockDim.x) {
    const int t = (int)(i / runs), s = (int)(i % runs);
    const u16* p = xh + t * ldx + 32 * s;
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < 32; k += 8) {
        const uint4 v = *(const uint4*)(p + k);
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            sum += h2f((u16)(w[q] & 0xffffu));
            sum += h2f((u16)(w[q] >> 16));
        }
    }
    sum *= 0.03125f;
    const u16 h = f2h(sum);
    const u16 l = f2h(sum - h2f(h));
    out[i] = (u32)h | ((u32)l << 16);
    }
}

// y (n tokens x rows) = W x for W Q4_K (rows x cols, blocks as in the file), x as halves x^ =
// x 2^B_t (x16_split, ldx halves per token) with run sums xs (x16_runsums); blockIdx.y takes
// column blocks [y kb, min((y + 1) kb, cols / 256)). NT: 8-token tiles per token warp (1..4, 8);
// blockDim = 32 WR WT with wt = warp / WR.
// XREG: only the weights go through the `stages` cp.async stages; the activations and run sums
// of step k + 1 are loaded into registers during step k and stored after its products into the
// other of two shared buffers, so the stages (the weights in flight) are not limited by the
// activations' room (32 tokens take 17 KB a step). Needs WR >= 4 (at most XR 16-byte pieces per
// thread). The same arithmetic in the same order: the same bits.
template <int NT, bool XREG>
__device__ __forceinline__ void qmma_q4_k(const u8* __restrict__ W, int rows, int cols, const u16* __restrict__ xh, long long ldx,
                                          const u32* __restrict__ xs, int n, const u32* __restrict__ xmax, int kb, int wr_count,
                                          int stages, float* __restrict__ y, float* __restrict__ part) {
    extern __shared__ __align__(128) u8 qm_mem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nthreads = blockDim.x;
    const int g = lane >> 2, t = lane & 3;
    const int wr = warp % wr_count, wt = warp / wr_count;
    const int rb = 32 * wr_count, ntok = (blockDim.x >> 5) / wr_count * NT * 8;
    const int nb = cols >> 8, runs = cols >> 5;
    const int b_begin = blockIdx.y * kb, b_end = min(nb, b_begin + kb), steps = b_end - b_begin;
    const long long r0 = (long long)blockIdx.x * rb;
    const int wbytes = rb * QM_WROW, xbytes = ntok * (QM_XROW + QM_XSROW);
    const int sbytes = XREG ? wbytes : wbytes + xbytes;  // a stage
    const int ntok_valid = min(n, ntok);
    // Step k's weights, and its activations and run sums.
    auto wstage = [&](int k) { return qm_mem + (k % stages) * sbytes; };
    auto xstage = [&](int k) { return XREG ? qm_mem + stages * sbytes + (k & 1) * xbytes : wstage(k) + wbytes; };
    u8* sc = qm_mem + stages * sbytes + (XREG ? 2 * xbytes : 0) + warp * 32 * QM_CROW;  // the warp's rows' decoded constants, this step
    // XREG: this thread's 16-byte pieces of a step's activations (34 per token: 32 of x^, 2 of
    // run sums), piece tid + q nthreads.
    constexpr int XR = XREG ? (17 * NT + 7) / 8 : 1;
    uint4 xr[XR];
    auto xpiece = [&](int i, int k, const u8** src, u8** dst) {
        const int tk = i / 34, p = i - 34 * tk, b = b_begin + k;
        u8* xb = xstage(k);
        if (p < 32) {
            *src = (const u8*)(xh + tk * ldx + 256 * b) + 16 * p;
            *dst = xb + tk * QM_XROW + 16 * p;
        } else {
            *src = (const u8*)(xs + (long long)tk * runs + 8 * b) + 16 * (p - 32);
            *dst = xb + ntok * QM_XROW + tk * QM_XSROW + 16 * (p - 32);
        }
    };
    // Step k's pieces from global memory into xr (load), or from xr into its shared buffer.
    auto xmove = [&](int k, bool load) {
#pragma unroll
        for (int q = 0; q < XR; q++) {
            const int i = tid + q * nthreads;
            if (i < ntok_valid * 34) {
                const u8* src;
                u8* dst;
                xpiece(i, k, &src, &dst);
                if (load)
                    xr[q] = __ldg((const uint4*)src);
                else
                    *(uint4*)dst = xr[q];
            }
        }
    };
    // Step k's block column into stage k % stages, 16 bytes per cp.async spread over the
    // threads: the rows' 144 bytes and, but for XREG, the tokens' 512 bytes of x^ and 32 of run
    // sums; then one commit group per step (empty past the last, so the group count stays the
    // step count).
    auto issue = [&](int k) {
        if (k < steps) {
            const int b = b_begin + k;
            u8* st = wstage(k);
            for (int r = tid; r < rb; r += nthreads) {
                const u8* src = W + (min(r0 + r, (long long)rows - 1) * nb + b) * 144;
#pragma unroll
                for (int p = 0; p < 9; p++) cp_async16(st + r * QM_WROW + 16 * p, src + 16 * p);
            }
            if (!XREG) {
                for (int i = tid; i < ntok_valid * 34; i += nthreads) {
                    const u8* src;
                    u8* dst;
                    xpiece(i, k, &src, &dst);
                    cp_async16(dst, src);
                }
            }
        }
        cp_async_commit();
    };
    // XREG's pieces must fit its registers (the host asks for 4 or more row warps).
    if (XREG && XR * nthreads < ntok_valid * 34) __trap();
    for (int k = 0; k < stages - 1; k++) issue(k);
    if (XREG) {
        xmove(0, true);
        xmove(0, false);
    }

    float acc[2][NT][4], T[2][NT][4];
#pragma unroll
    for (int mr = 0; mr < 2; mr++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mr][j][e] = 0.0f;
    for (int k = 0; k < steps; k++) {
        const u8* sw = wstage(k);
        const u8* sx = xstage(k);
        const u8* sxs = sx + ntok * QM_XROW;
        cp_async_wait_stages(stages);  // this thread's copies of step k have landed
        __syncthreads();               // everyone's (and XREG's stores); everyone is past step k - 1
        issue(k + stages - 1);         // into the stage step k - 1 used
        if (XREG && k + 1 < steps) xmove(k + 1, true);  // in flight during this step's products
        {
            // Lane l decodes row 32 wr + l's scales and mins (get_scale_min_k4 on the three scale
            // words at once) into the warp's constants: small integers become halves as
            // (0x6400 | v) - 1024, exactly.
            const uint4 hd = *(const uint4*)(sw + (32 * wr + lane) * QM_WROW);
            const u32 sc_lo = hd.y & 0x3f3f3f3fu;                                          // sc 0..3
            const u32 m_lo = hd.z & 0x3f3f3f3fu;                                           // m 0..3
            const u32 sc_hi = (hd.w & 0x0f0f0f0fu) | ((hd.y >> 2) & 0x30303030u);          // sc 4..7
            const u32 m_hi = ((hd.w >> 4) & 0x0f0f0f0fu) | ((hd.z >> 2) & 0x30303030u);    // m 4..7
            u32* c = (u32*)(sc + lane * QM_CROW);
#pragma unroll
            for (int cc = 0; cc < 4; cc++) {
                const u32 w = cc < 2 ? sc_lo : sc_hi;
                const u32 s0 = qm_pair(w, 2 * (cc & 1)), s1 = qm_pair(w, 2 * (cc & 1) + 1);
                *(uint4*)(c + 4 * cc) = make_uint4(s0, hmul2(s0, 0xe400e400u), hmul2(s1, 0x2c002c00u), hmul2(s1, 0xd400d400u));
            }
            *(uint4*)(c + 16) = make_uint4(qm_pair(m_lo, 0), qm_pair(m_lo, 1), qm_pair(m_lo, 2), qm_pair(m_lo, 3));
            *(uint4*)(c + 20) = make_uint4(qm_pair(m_hi, 0), qm_pair(m_hi, 1), qm_pair(m_hi, 2), qm_pair(m_hi, 3));
            *(uint2*)(c + 24) = make_uint2(__float_as_uint(h2f((u16)(hd.x & 0xffffu))), __float_as_uint(-32.0f * h2f((u16)(hd.x >> 16))));
        }
        __syncwarp();
#pragma unroll
        for (int mr = 0; mr < 2; mr++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) T[mr][j][e] = 0.0f;
        const int rloc = 32 * wr + g;  // row of (mr, h) in the block: rloc + 16 mr + 8 h; g + 16 mr + 8 h in the warp's
#pragma unroll
        for (int c = 0; c < 4; c++) {
            // Code bytes 32c + 8t .. +7 of the thread's 4 rows, bytes reordered (0, 2, 1, 3) so a
            // mask takes the codes of two adjacent columns.
            u32 wlo[2][2], whi[2][2];
#pragma unroll
            for (int mr = 0; mr < 2; mr++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint2 v = *(const uint2*)(sw + (rloc + 16 * mr + 8 * h) * QM_WROW + 16 + 32 * c + 8 * t);
                    wlo[mr][h] = __byte_perm(v.x, 0, 0x3120);
                    whi[mr][h] = __byte_perm(v.y, 0, 0x3120);
                }
#pragma unroll
            for (int hi = 0; hi < 2; hi++) {  // sub-block 2c + hi: the low nibbles, then the high
                u32 a[2][2][4];                // [step e][mr]
#pragma unroll
                for (int mr = 0; mr < 2; mr++) {
                    u32 sc2[2], nb2[2];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const uint2 k2 = *(const uint2*)(sc + (g + 16 * mr + 8 * h) * QM_CROW + 16 * c + 8 * hi);
                        sc2[h] = k2.x;
                        nb2[h] = k2.y;
                    }
#pragma unroll
                    for (int e = 0; e < 2; e++) {
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const u32 v = e ? whi[mr][h] : wlo[mr][h];
                            const u32 m = hi ? 0x00f000f0u : 0x000f000fu;
                            const u32 p01 = (v & m) | 0x64006400u;          // columns j, j + 1
                            const u32 p23 = ((v >> 8) & m) | 0x64006400u;   // columns j + 2, j + 3
                            a[e][mr][h] = hfma2(p01, sc2[h], nb2[h]);
                            a[e][mr][2 + h] = hfma2(p23, sc2[h], nb2[h]);
                        }
                    }
                }
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const int tok = (wt * NT + j) * 8 + g;
                    const uint4 b = *(const uint4*)(sx + tok * QM_XROW + 2 * (64 * c + 32 * hi + 8 * t));
#pragma unroll
                    for (int mr = 0; mr < 2; mr++) {
                        mma_f16(T[mr][j], a[0][mr], b.x, b.y);
                        mma_f16(T[mr][j], a[1][mr], b.z, b.w);
                    }
                }
            }
        }
        // The block's end: U = sum_s m_s (h_s + l_s), then acc += d T + (-32 dmin) U.
#pragma unroll
        for (int mr = 0; mr < 2; mr++) {
            const u32* ca = (const u32*)(sc + (g + 16 * mr) * QM_CROW);
            const u32* cb = (const u32*)(sc + (g + 16 * mr + 8) * QM_CROW);
            const u32 am[4] = {ca[16 + t], cb[16 + t], ca[20 + t], cb[20 + t]};
            const float da = __uint_as_float(ca[24]), na = __uint_as_float(ca[25]);
            const float db = __uint_as_float(cb[24]), nb_ = __uint_as_float(cb[25]);
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int tok = (wt * NT + j) * 8 + g;
                const u32* xsp = (const u32*)(sxs + tok * QM_XSROW);
                float u[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma_f16(u, am, xsp[t], xsp[t + 4]);
                acc[mr][j][0] = fmaf(da, T[mr][j][0], acc[mr][j][0]);
                acc[mr][j][1] = fmaf(da, T[mr][j][1], acc[mr][j][1]);
                acc[mr][j][2] = fmaf(db, T[mr][j][2], acc[mr][j][2]);
                acc[mr][j][3] = fmaf(db, T[mr][j][3], acc[mr][j][3]);
                acc[mr][j][0] = fmaf(na, u[0], acc[mr][j][0]);
                acc[mr][j][1] = fmaf(na, u[1], acc[mr][j][1]);
                acc[mr][j][2] = fmaf(nb_, u[2], acc[mr][j][2]);
                acc[mr][j][3] = fmaf(nb_, u[3], acc[mr][j][3]);
            }
        }
        // Step k + 1's activations into the buffer step k - 1 read (everyone is past it).
        if (XREG && k + 1 < steps) xmove(k + 1, false);
    }
    // D fragment: rows r0 + 32 wr + 16 mr + g (+ 8), tokens 8 (wt NT + j) + 2t (+ 1).
#pragma unroll
    for (int mr = 0; mr < 2; mr++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const long long r = r0 + 32 * wr + 16 * mr + g + ((e & 2) ? 8 : 0);
                const int tok = (wt * NT + j) * 8 + 2 * t + (e & 1);
                if (r >= rows || tok >= n) continue;
                if (gridDim.y == 1) {
                    y[(long long)tok * rows + r] = acc[mr][j][e] * x16_down(xmax[tok]);
                } else {
                    part[((long long)blockIdx.y * n + tok) * rows + r] = acc[mr][j][e];
                }
            }
}

// qmma_q4_k_NT and, activations through registers, qmma_q4_k_xNT.
#define QMMA_Q4K(NAME, NT, XREG)                                                                                        \
    extern "C" __global__ void __launch_bounds__(256, 1) NAME(const u8* W, int rows, int cols, const u16* xh, long long ldx, \
                                                              const u32* xs, int n, const u32* xmax, int kb, int wr_count,  \
                                                              int stages, float* y, float* part) {                          \
        qmma_q4_k<NT, XREG>(W, rows, cols, xh, ldx, xs, n, xmax, kb, wr_count, stages, y, part);                           \
    }
QMMA_Q4K(qmma_q4_k_1, 1, false)
QMMA_Q4K(qmma_q4_k_2, 2, false)
QMMA_Q4K(qmma_q4_k_3, 3, false)
QMMA_Q4K(qmma_q4_k_4, 4, false)
QMMA_Q4K(qmma_q4_k_8, 8, false)
QMMA_Q4K(qmma_q4_k_x1, 1, true)
QMMA_Q4K(qmma_q4_k_x2, 2, true)
QMMA_Q4K(qmma_q4_k_x3, 3, true)
QMMA_Q4K(qmma_q4_k_x4, 4, true)

// y[t][r] = ((part[0][t][r] + part[1][t][r]) + ...) 2^-B_t: qmma's column ranges in order.
extern "C" __global__ void qmma_reduce(const float* __restrict__ part, int ksplit, int n, int rows, const u32* __restrict__ xmax,
                                       float* __restrict__ y) {
    const long long total = (long long)n * rows;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        float s = part[i];
        for (int z = 1; z < ksplit; z++) s += part[(long long)z * total + i];
        y[i] = s * x16_down(xmax[(int)(i / rows)]);
    }
}
