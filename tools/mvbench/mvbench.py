"""Time Q4_K matrix-vector variants (one token) on the GPU with CuPy: the engine's float kernel
(mv_q4_k_R_1), its integer ones (mvq_q4_k, mvq_q4_k_wide) and the candidates in variants.cu, at the
30B's shapes, each checked against the float kernel's output.
Usage (on the GPU machine, repo root): python3 tools/mvbench/mvbench.py"""
import itertools, sys, time
import numpy as np
import cupy as cp
from graphtime import graph_time

root = "crates/cuda/kernels/"
src = open(root + "common.cuh").read() + "\n" + open(root + "matvec.cu").read() + "\n" + open("tools/mvbench/variants.cu").read()
mod = cp.RawModule(code=src, options=("--std=c++17", "-default-device"), backend="nvrtc")
dev = cp.cuda.Device()
n_sm = dev.attributes["MultiProcessorCount"]
print(f"{dev.compute_capability} SMs {n_sm}")

def q4k_matrix(rows, cols, copies):
    nb = cols // 256
    mats = []
    rng = np.random.default_rng(rows * 7 + cols)
    for _ in range(copies):
        b = rng.integers(0, 256, size=(rows * nb, 144), dtype=np.uint8)
        d = (rng.random(rows * nb) * 0.01 + 0.001).astype(np.float16).view(np.uint8).reshape(-1, 2)
        m = (rng.random(rows * nb) * 0.01 + 0.001).astype(np.float16).view(np.uint8).reshape(-1, 2)
        b[:, 0:2] = d
        b[:, 2:4] = m
        mats.append(cp.asarray(b.reshape(-1)))
    return mats

def timeit(launch, mats, reps=30):
    """Per-launch time of launch(W) over the rotated matrices `mats` (graphtime.py)."""
    return graph_time(lambda i: launch(mats[i]), len(mats), reps)

shapes = [(19968, 6656), (4096, 6656), (6656, 19968), (6656, 4096), (256, 6656)]
if len(sys.argv) > 1:
    shapes = [tuple(map(int, s.split("x"))) for s in sys.argv[1:]]
for rows, cols in shapes:
    nb = cols // 256
    mbytes = rows * nb * 144
    copies = max(2, int(np.ceil(240e6 / mbytes)))
    mats = q4k_matrix(rows, cols, copies)
    x = cp.asarray((np.random.default_rng(1).random(cols, dtype=np.float32) - 0.5))
    xs = x.reshape(-1, 8).sum(axis=1).astype(cp.float32)
    y = cp.zeros(rows, dtype=cp.float32)
    results = []
    # engine kernel (R as the host picks it)
    R = 4 if rows >= 16384 else (2 if rows >= 4096 else 1)
    f = mod.get_function(f"mv_q4_k_{R}_1")
    launch = lambda W: f(((rows + R - 1) // R,), (128,), (W, np.int64(0), x, xs, y, np.int32(rows), np.int32(cols)))
    t = timeit(launch, mats)
    ref = None
    launch(mats[0]); ref = y.get().copy()
    results.append((f"engine mv R={R}", t, 0))
    def check(name):
        got = y.get()
        err = float(np.max(np.abs(got - ref)) / max(1e-30, np.max(np.abs(ref))))
        return err
    tthreads = (nb * 8 + 31) // 32 * 32
    for name in ["t4", "t4p_s", "t8_s", "mvq_q4_k_wide", "mvq_q4_k"]:
        if (name.endswith("_s") or name == "mvq_q4_k") and tthreads > 256:
            continue
        f = mod.get_function(name)
        rstep = 8 if name in ("t8", "t8_s", "t8p_s") else 4
        best = None
        for per_sm in [1, 2, 3, 4, 6, 8]:
            slots = per_sm * n_sm
            rpb = -(-rows // slots)
            rpb = -(-rpb // rstep) * rstep
            grid = -(-rows // rpb)
            launch = lambda W: f((grid,), (tthreads,), (W, x, y, np.int32(rows), np.int32(cols), np.int32(rpb)))
            try:
                t = timeit(launch, mats)
            except Exception as ex:
                print(name, per_sm, "failed", ex)
                continue
            launch(mats[0]); err = check(name)
            if best is None or t < best[1]:
                best = (f"{name} (regs {f.num_regs}, {per_sm}/SM)", t, err)
        if best:
            results.append(best)
    for name in ["s2", "s2u4"]:
        f = mod.get_function(name)
        smem = (cols + (cols // 64) * 4 + cols // 16) * 4
        f.max_dynamic_shared_size_bytes = smem
        rw = {"s1": 1, "s2": 2, "s4": 4, "s2u4": 2}[name]
        best = None
        for per_sm in [1, 2, 3, 4, 6, 8]:
            if per_sm * smem > 225 * 1024:
                continue
            slots = per_sm * n_sm
            rpb = -(-rows // slots)
            rpb = -(-rpb // (8 * rw)) * (8 * rw)
            grid = -(-rows // rpb)
            launch = lambda W: f((grid,), (256,), (W, x, y, np.int32(rows), np.int32(cols), np.int32(rpb)), shared_mem=smem)
            try:
                t = timeit(launch, mats)
            except Exception as ex:
                print(name, per_sm, "failed", ex)
                continue
            launch(mats[0]); err = check(name)
            if best is None or t < best[1]:
                best = (f"{name} (regs {f.num_regs}, {per_sm}/SM)", t, err)
        if best:
            results.append(best)
    print(f"\n== Q4_K {rows}x{cols}: {mbytes/1e6:.1f} MB")
    for name, t, err in results:
        print(f"{name:<34} {t:8.2f} us  {mbytes / t / 1e3:7.0f} GB/s  rel err {err:.1e}")
