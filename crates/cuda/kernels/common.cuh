// Shared helpers for Muser's CUDA kernels. Compiled by NVRTC at run time (no system headers):
// half and bfloat16 conversions go through PTX so no cuda_fp16.h is needed.
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define WARP 32

__device__ __forceinline__ float h2f(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ u16 f2h(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }
// Round to nearest even, NaN kept quiet: as ggml_compute_fp32_to_bf16 and the half crate.
__device__ __forceinline__ u16 f2bf(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 64u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// Keys per split of one token's attention (attn_partial, attn_tcd, attn_tcd2 and attn_combine
// compute it alike): the visible keys spread evenly over the launch's splits, at least
// ATTN_MIN_CHUNK each, so splits past the last key stay empty (their blocks return at once and
// attn_combine skips them). The host sizes a launch's splits by the caches' capacity (a recorded
// step's shape); without the floor, a short context in a long cache gave each of 64 splits a few
// keys: a 64-key tile of the tensor-core kernels mostly masked, 64 partials to merge per head.
// 128 keys are one pass of attn_partial's four warps and two tiles of attn_tcd.
// (`MUSER_NVRTC_DEFINES=ATTN_MIN_CHUNK=1` gives the old even split, for measuring.)
#ifndef ATTN_MIN_CHUNK
#define ATTN_MIN_CHUNK 128
#endif
__device__ __forceinline__ int attn_chunk(int n_keys, int n_split) {
    return max((n_keys + n_split - 1) / n_split, ATTN_MIN_CHUNK);
}

// Programmatic dependent launch (Hopper and newer; no-ops before sm_90 and for kernels launched
// the ordinary way). pdl_trigger: the kernel that follows in the stream may be scheduled now (its
// blocks fill the SMs this grid leaves idle, or frees). pdl_wait: block until the grids this one
// depends on have completed and their writes are visible; a kernel launched with the
// programmatic attribute (lib.rs launch_raw) must read nothing they write, and write nothing they
// read, before it.
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A load of data an earlier kernel wrote, for kernels that may be launched programmatically:
// not the read-only path. The compiler and ptxas move read-only (.nc, `__ldg`) loads above
// griddepcontrol.wait (ptxas 13.0 did, in the SASS of mvq_q4_k_pair: the activations were read
// before the wait, stale), since .nc promises the data does not change while the kernel runs; a
// programmatic launch breaks that promise. A plain C++ load of a `const __restrict__` pointer is
// made .nc by the compiler too (seen in the same SASS), so the load is written out: volatile, it
// stays after pdl_wait (also volatile). X_LOAD (MUSER_NVRTC_DEFINES, for measurements): 0 =
// ld.global.ca (L1 and L2, the default), 1 = ld.global.cg (L2 only, with a memory clobber: the
// form of d768fe3), 2 = __ldg (read-only path: wrong under PDL, on by default; lib.rs then turns PDL off),
// 3 = no load at all, values made from the address (timing only, the outputs wrong: what the
// one-token products' activation reads cost).
#ifndef X_LOAD
#define X_LOAD 0
#endif
__device__ __forceinline__ float4 ld_after_wait(const float* p) {
    float4 v;
#if X_LOAD == 2
    v = __ldg(reinterpret_cast<const float4*>(p));
#elif X_LOAD == 3
    const float f = (float)((unsigned)(reinterpret_cast<unsigned long long>(p) >> 4) & 1023u) * 1e-3f;
    v = make_float4(f, -f, 0.5f * f, 0.25f - f);
#elif X_LOAD == 1
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
#else
    asm volatile("ld.global.ca.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
#endif
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(t);
}

// 6-bit scale and min of sub-block j of a Q4_K/Q5_K block (get_scale_min_k4 of ggml-quants.c).
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* sc, int* m) {
    if (j < 4) { *sc = q[j] & 63; *m = q[j + 4] & 63; }
    else { *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}

// Weight formats as the backend stores them on the device (see matrix.rs):
//   F32/F16/BF16: row-major values.
//   Q4_K (144 B) and Q5_K (176 B): ggml's blocks as in the file (16-byte aligned).
//   Q8_0, Q4_0, Q6_K: split per matrix into arrays (structure of arrays) so every load is
//   aligned: Q8_0 = qs[nb][32] then d[nb]; Q4_0 = qs[nb][16] then d[nb];
//   Q6_K = ql[nb][128], qh[nb][64], sc[nb][16], d[nb].
#define FMT_F32 0
#define FMT_F16 1
#define FMT_BF16 2
#define FMT_Q8_0 3
#define FMT_Q4_0 4
#define FMT_Q4_K 5
#define FMT_Q5_K 6
#define FMT_Q6_K 7

// The KV cache of token t's sequence at `layer`: seqtab[t] is the device address of that cache's
// table of n_layer x {K base, V base, ring slots (0 for a plane)} (lib.rs CudaKv::table), so one
// launch serves tokens of many sequences, and a captured graph any caches.
__device__ __forceinline__ void kv_layer(const u64* seqtab, int t, int layer, u8** kc, u8** vc, int* ring) {
    const u64* e = (const u64*)seqtab[t] + 3 * layer;
    *kc = (u8*)e[0];
    *vc = (u8*)e[1];
    *ring = (int)e[2];
}

// The cache types (lib.rs kv_code; kv.cu writes them, attention.cu reads them).
#define KV_F32 0
#define KV_F16 1
#define KV_BF16 2
#define KV_Q8_0 3

// The exponent S with m 2^S < 2^top, clamped to +-lim (m >= 0 a largest value, as f32 bits; 0 for
// 0, NaN or Inf: those propagate as a float product would): the power-of-two scales that put
// values into a narrow float format.
__device__ __forceinline__ int pow2_shift(u32 maxbits, int top, int lim) {
    const float m = __uint_as_float(maxbits);
    if (!(m <= 3.0e38f) || m == 0.0f) return 0;
    int E;
    frexpf(m, &E);  // m = f 2^E, f in [0.5, 1): m < 2^E
    return min(max(top - E, -lim), lim);
}

// Into f16, below 2^14 (dequant.cu's f16 products, attention.cu's tensor-core attention).
__device__ __forceinline__ int f16_shift(u32 maxbits, int lim) { return pow2_shift(maxbits, 14, lim); }

// A matrix's scale 2^A (from its largest |w|, w16_max) and a token's 2^B_t and 2^-B_t (from
// its largest |x|, x16_rowmax): the powers of two that put f16 products' operands in range
// (dequant.cu's "Products of many tokens on the f16 tensor cores"; qmma.cu).
__device__ __forceinline__ float w16_up(const u32* wmax) { return ldexpf(1.0f, f16_shift(*wmax, 60)); }
__device__ __forceinline__ float x16_up(u32 xmax) { return ldexpf(1.0f, f16_shift(xmax, 120)); }
__device__ __forceinline__ float x16_down(u32 xmax) { return ldexpf(1.0f, -f16_shift(xmax, 120)); }

// d += a b on the f16 tensor cores, f32 accumulation (mma.sync.m16n8k16, PTX ISA fragments:
// groupID g = lane / 4, t = lane % 4; A row-major: a0 = row g, k 2t..2t+1; a1 = row g + 8; a2 =
// row g, k 2t+8..; a3 = row g + 8, k 2t+8..; B column-major: b0 = k 2t..2t+1 of column g, b1 = k
// 2t+8..; D: d0, d1 = row g, columns 2t, 2t+1; d2, d3 = row g + 8). Attention's tensor-core
// kernel and the f16 products straight from Q4_K blocks (qmma.cu) use it.
__device__ __forceinline__ void mma_f16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ==== The copy engine (TMA, sm_90): bulk copies into shared memory counted on mbarriers ====
// Used by the staged one-token kernels (matvec.cu) and the products of a few tokens (qmma.cu).
__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(u64* bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
#endif
}
// The barriers' initialisation, visible to the copy engine (the async proxy) before its first use.
__device__ __forceinline__ void mbar_init_fence() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// The block's `stages` barriers initialised (thread 0) and visible to every thread and to the
// copy engine before their first use.
__device__ __forceinline__ void mbar_init_all(u64* bars, int stages) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; s++) mbar_init(&bars[s]);
        mbar_init_fence();
    }
    __syncthreads();
}

// The issuing thread's arrival, announcing `bytes` of copies that complete this phase.
__device__ __forceinline__ void mbar_expect(u64* bar, u32 bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
#endif
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory, counted
// on `bar`.
__device__ __forceinline__ void tma_copy(void* dst, const void* src, u32 bytes, u64* bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
#endif
}
// Wait for the phase of `bar` with this parity to complete (its copies landed and visible).
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
#if __CUDA_ARCH__ >= 900
    asm volatile("{\n\t.reg .pred done;\n"
                 "MBAR_WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
                 "@!done bra MBAR_WAIT_%=;\n}" ::"r"(smem_addr(bar)), "r"(parity) : "memory");
#endif
}
