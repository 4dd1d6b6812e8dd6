"""How fast can one launch read the FFN's gate and up (two Q4_K 19968x6656 matrices, 149.5 MB)?
Times, with CuPy (each launch replayed from a CUDA graph, the matrices rotated through 6 copies so
they stream from HBM, nothing else on the GPU):
  - a plain read of the same bytes (uint4 loads, grid-stride, every byte once): the ceiling;
  - the engine's register pair kernel (mvq_q4_k_pair) and its TMA-staged form (mvq_q4_k_pair_tma)
    at several blocks per SM and stages.
Usage (on the GPU machine, repo root): python3 tools/mvbench/ceiling.py"""
import numpy as np
import cupy as cp
from graphtime import cdiv, graph_time, random_q4k

root = "crates/cuda/kernels/"
read_src = r"""
extern "C" __global__ void stream_read(const uint4* __restrict__ p, long long n, unsigned* out) {
    unsigned acc = 0;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x, step = (long long)gridDim.x * blockDim.x;
    for (; i + 3 * step < n; i += 4 * step) {
        uint4 a = __ldg(p + i), b = __ldg(p + i + step), c = __ldg(p + i + 2 * step), d = __ldg(p + i + 3 * step);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += step) { uint4 a = __ldg(p + i); acc ^= a.x ^ a.y ^ a.z ^ a.w; }
    if (acc == 0x9e3779b9u) out[0] = acc;  // keeps the loads
}
"""
src = open(root + "common.cuh").read() + "\n" + open(root + "matvec.cu").read() + "\n" + read_src
mod = cp.RawModule(code=src, options=("--std=c++17",), backend="nvrtc")
dev = cp.cuda.Device()
n_sm = dev.attributes["MultiProcessorCount"]
print(f"sm_{dev.compute_capability}, {n_sm} SMs")


rows, cols = 19968, 6656
nb = cols // 256
mat_bytes = rows * nb * 144
copies = 6
rng = np.random.default_rng(5)
mats = []
for _ in range(copies):
    mats.append(cp.asarray(random_q4k(rng, rows, nb).reshape(-1)))
pair_bytes = 2 * mat_bytes
x = cp.asarray(rng.random(cols, dtype=np.float32) - 0.5)
y = cp.zeros(rows, dtype=cp.float32)
y2 = cp.zeros(rows, dtype=cp.float32)
out = cp.zeros(1, dtype=cp.uint32)

print(f"\n== a read of {pair_bytes / 1e6:.1f} MB (two matrices, back to back in one buffer)")
big = [cp.concatenate([mats[i], mats[(i + 1) % copies]]) for i in range(copies)]
f = mod.get_function("stream_read")
n16 = pair_bytes // 16
best = None
for threads in [256, 512, 1024]:
    for per_sm in [1, 2, 4, 8]:
        if threads * per_sm > 2048:
            continue
        grid = per_sm * n_sm
        t = graph_time(lambda i: f((grid,), (threads,), (big[i], np.int64(n16), out)), copies)
        print(f"stream_read {threads} threads x {per_sm}/SM: {t:7.2f} us {pair_bytes / t / 1e3:6.0f} GB/s")
del big

print(f"\n== mvq_q4_k_pair {rows}x{cols} x2 ({pair_bytes / 1e6:.1f} MB)")
ref = None
f = mod.get_function("mvq_q4_k_pair")
threads = (nb * 8 + 31) // 32 * 32
for per_sm in [1, 2, 3, 4]:
    slots = per_sm * n_sm
    vrows = 2 * rows
    rpb = cdiv(cdiv(vrows, slots), 4) * 4
    grid = cdiv(vrows, rpb)
    launch = lambda i: f((grid,), (threads,), (mats[i], mats[(i + 1) % copies], x, y, y2, np.int32(rows), np.int32(cols), np.int32(rpb)))
    t = graph_time(launch, copies)
    launch(0)
    got = np.concatenate([y.get(), y2.get()])
    ref = got if ref is None else ref
    err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    print(f"register, {per_sm}/SM requested (regs {f.num_regs}): {t:7.2f} us {pair_bytes / t / 1e3:6.0f} GB/s  vs first {err:.1e}")

name, R = "mvq_q4_k_pair_tma", 4
print(f"\n== {name} (4 threads per block, {R} rows per step)")
f = mod.get_function(name)
threads = (nb * 4 + 31) // 32 * 32
stride = R * nb * 144
f.max_dynamic_shared_size_bytes = 200 * 1024
by_regs = 65536 // (((f.num_regs + 7) // 8 * 8) * threads)
for stages in [2, 3, 4, 6, 8]:
    smem = stages * stride
    if smem > 200 * 1024:
        continue
    fit = max(1, min(by_regs, (228 * 1024) // (smem + 1024 + 768)))
    for per_sm in sorted({2, 4, fit - 1, fit}):
        if per_sm > fit or per_sm < 1:
            continue
        slots = per_sm * n_sm
        vrows = 2 * rows
        rpb = cdiv(cdiv(vrows, slots), R) * R
        grid = cdiv(vrows, rpb)
        launch = lambda i: f((grid,), (threads,), (mats[i], mats[(i + 1) % copies], x, y, y2, np.int32(rows), np.int32(cols), np.int32(rpb),
                                                   np.uint64(0), np.uint64(0), np.int32(nb), np.int32(stages)), shared_mem=smem)
        t = graph_time(launch, copies)
        launch(0)
        got = np.concatenate([y.get(), y2.get()])
        err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        print(f"staged R={R}, {stages} stages, {per_sm}/SM (regs {f.num_regs}, {smem} B): {t:7.2f} us {pair_bytes / t / 1e3:6.0f} GB/s  vs register {err:.1e}")
