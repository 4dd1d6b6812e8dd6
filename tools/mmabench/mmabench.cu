// Throughput of legacy mma.sync on the int8 tensor cores (m16n8k16 vs m16n8k32) and of the
// integer multiply-add, per SM and clock: what bounds the kernels of kernels/mmq.cu.
// nvcc -O3 -arch=sm_90 mmabench.cu -o mmabench && ./mmabench
#include <cstdio>
#include <cuda_runtime.h>
typedef unsigned u32;
template <int K>
__global__ void mma_loop(int iters, int* out) {
    int d[8][4] = {};
    u32 a0 = threadIdx.x, a1 = a0 * 3, a2 = a0 * 5, a3 = a0 * 7, b0 = a0 * 11, b1 = a0 * 13;
    for (int i = 0; i < iters; i++) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (K == 16)
                asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                             : "+r"(d[j][0]), "+r"(d[j][1]), "+r"(d[j][2]), "+r"(d[j][3]) : "r"(a0), "r"(a1), "r"(b0));
            else
                asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                             : "+r"(d[j][0]), "+r"(d[j][1]), "+r"(d[j][2]), "+r"(d[j][3])
                             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
    }
    int s = 0;
    for (int j = 0; j < 8; j++) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
__global__ void imad_loop(int iters, int* out) {
    int v[16];
    for (int j = 0; j < 16; j++) v[j] = threadIdx.x + j;
    const int s = blockIdx.x | 3;
    for (int i = 0; i < iters; i++) {
#pragma unroll
        for (int j = 0; j < 16; j++) asm volatile("mad.lo.s32 %0, %1, %2, %0;" : "+r"(v[j]) : "r"(s), "r"(v[(j + 1) & 15]));
    }
    int t = 0;
    for (int j = 0; j < 16; j++) t += v[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = t;
}
int main() {
    int sms, clk;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
    int* out;
    cudaMalloc(&out, 1 << 24);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const int iters = 4096;
    for (int warps = 4; warps <= 16; warps *= 2) {
        for (int k : {16, 32}) {
            auto run = [&] { if (k == 16) mma_loop<16><<<sms, 32 * warps>>>(iters, out); else mma_loop<32><<<sms, 32 * warps>>>(iters, out); };
            run();
            cudaEventRecord(e0);
            run();
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            const double macs = (double)sms * warps * iters * 8 * 16 * 8 * k;
            const double cyc = ms * 1e-3 * clk * 1e3;
            printf("mma m16n8k%d s8.u8, %2d warps/SM: %.0f int8 TOPS, %.0f MAC/clk/SM (max clock %.2f GHz), %.1f clk per mma per SMSP\n", k, warps,
                   2 * macs / (ms * 1e-3) / 1e12, macs / sms / cyc, clk / 1e6, cyc / ((double)warps / 4 * iters * 8));
        }
        imad_loop<<<sms, 32 * warps>>>(iters, out);
        cudaEventRecord(e0);
        imad_loop<<<sms, 32 * warps>>>(iters, out);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        const double cyc = ms * 1e-3 * clk * 1e3;
        printf("IMAD, %2d warps/SM: %.2f warp instructions per clk per SMSP\n", warps, (double)warps / 4 * iters * 16 / cyc);
    }
    return 0;
}
