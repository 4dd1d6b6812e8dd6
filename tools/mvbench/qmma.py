"""qmma (kernels/qmma.cu) alone: the FFN's up matrix (Q4_K 19968x6656, 74.8 MB) times 32 and 64
tokens, with CuPy, each launch (qmma and, with column ranges, qmma_reduce) replayed from a CUDA
graph, the matrices rotated through 4 copies so they stream from HBM. First a check of the
outputs against numpy (the weights dequantized in f64, times the same f16 activations), then the
time per product for the shapes lib.rs's QmmaShape allows: row warps (MUSER_QMMA_WR), stages
(MUSER_QMMA_STAGES), blocks per SM for the column ranges (MUSER_QMMA_WAVE), the activations
through registers (MUSER_QMMA_XREG) and one token warp for 64 tokens (MUSER_QMMA_NT8).
Usage (on the GPU machine, repo root): python3 tools/mvbench/qmma.py"""
import numpy as np
import cupy as cp
from graphtime import cdiv, graph_time, random_q4k

root = "crates/cuda/kernels/"
src = open(root + "common.cuh").read() + "\n" + open(root + "qmma.cu").read()
mod = cp.RawModule(code=src, options=("--std=c++17",), backend="nvrtc")
dev = cp.cuda.Device()
n_sm = dev.attributes["MultiProcessorCount"]
print(f"sm_{dev.compute_capability}, {n_sm} SMs")

# kernels/qmma.cu's layout (lib.rs QM_*)
WROW, CROW, XROW, XSROW = 160, 112, 576, 32
MAX_SMEM = 226 * 1024


rows, cols = 19968, 6656
nb = cols // 256
mat_bytes = rows * nb * 144
copies = 4
rng = np.random.default_rng(7)
host = [random_q4k(rng, rows, nb) for _ in range(copies)]
mats = [cp.asarray(b.reshape(-1)) for b in host]


def dequant_rows(b, rlist):
    """ggml's dequantize_row_q4_K for rows rlist of matrix bytes b ([rows * nb, 144]), in f64."""
    out = np.zeros((len(rlist), cols))
    for i, r in enumerate(rlist):
        blk = b[r * nb:(r + 1) * nb]
        d = blk[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float64)
        dmin = blk[:, 2:4].copy().view(np.float16)[:, 0].astype(np.float64)
        q = blk[:, 4:16].astype(np.int64)
        sc = np.zeros((nb, 8), np.int64)
        mn = np.zeros((nb, 8), np.int64)
        for j in range(8):
            if j < 4:
                sc[:, j] = q[:, j] & 63
                mn[:, j] = q[:, j + 4] & 63
            else:
                sc[:, j] = (q[:, j + 4] & 0xF) | ((q[:, j - 4] >> 6) << 4)
                mn[:, j] = (q[:, j + 4] >> 4) | ((q[:, j] >> 6) << 4)
        codes = blk[:, 16:].astype(np.int64)
        w = np.zeros((nb, 256))
        for c in range(4):
            lo = codes[:, 32 * c:32 * c + 32] & 0xF
            hi = codes[:, 32 * c:32 * c + 32] >> 4
            w[:, 64 * c:64 * c + 32] = d[:, None] * sc[:, 2 * c:2 * c + 1] * lo - dmin[:, None] * mn[:, 2 * c:2 * c + 1]
            w[:, 64 * c + 32:64 * c + 64] = d[:, None] * sc[:, 2 * c + 1:2 * c + 2] * hi - dmin[:, None] * mn[:, 2 * c + 1:2 * c + 2]
        out[i] = w.reshape(-1)
    return out


f_runs = mod.get_function("x16_runsums")
f_red = mod.get_function("qmma_reduce")


def setup(n):
    xh = cp.asarray((rng.random((n, cols)) * 2 - 1).astype(np.float16))
    xs = cp.zeros(n * cols // 32, dtype=cp.uint32)
    f_runs((cdiv(n * cols // 32, 256),), (256,), (xh, np.int64(cols), np.int32(n), np.int32(cols), xs))
    # 2^B_t = 1: a largest value in [2^13, 2^14).
    xmax = cp.full(n, np.float32(10000.0).view(np.uint32), dtype=cp.uint32)
    return xh, xs, xmax


def config(n, wr, stages, wave, xreg=False, nt8=False):
    """lib.rs qmma's choices for n tokens and a QmmaShape."""
    tiles = cdiv(n, 8)
    if tiles <= 4:
        wt, nt = 1, tiles
    elif nt8 and not xreg:
        wt, nt = 1, 8
    else:
        wt, nt = 2, cdiv(tiles, 2)
    wr = max(1, min(wr, 8 // wt))
    xreg = xreg and wr >= 4
    rb, ntok = 32 * wr, 8 * nt * wt
    xbytes = ntok * (XROW + XSROW)
    smem = (stages * rb * WROW + 2 * xbytes if xreg else stages * (rb * WROW + xbytes)) + 32 * wr * wt * CROW
    row_blocks = cdiv(rows, rb)
    want = cdiv(wave * n_sm, cdiv(rows, 128))
    per = cdiv(nb, max(1, min(want, nb)))
    ksplit = cdiv(nb, per)
    name = f"qmma_q4_k_x{nt}" if xreg else f"qmma_q4_k_{nt}"
    return name, wt, wr, smem, row_blocks, per, ksplit


def launcher(n, xh, xs, xmax, y, part, wr, stages, wave, xreg=False, nt8=False):
    name, wt, wr, smem, row_blocks, per, ksplit = config(n, wr, stages, wave, xreg, nt8)
    f = mod.get_function(name)
    f.max_dynamic_shared_size_bytes = MAX_SMEM

    def launch(i):
        f((row_blocks, ksplit), (32 * wr * wt,), (mats[i], np.int32(rows), np.int32(cols), xh, np.int64(cols), xs, np.int32(n), xmax,
                                                   np.int32(per), np.int32(wr), np.int32(stages), y, part), shared_mem=smem)
        if ksplit > 1:
            f_red((min(4096, cdiv(n * rows, 256)),), (256,), (part, np.int32(ksplit), np.int32(n), np.int32(rows), xmax, y))
    return launch, (name, wt, wr, smem, ksplit)


for n in [32, 64]:
    xh, xs, xmax = setup(n)
    y = cp.zeros(n * rows, dtype=cp.float32)
    part = cp.zeros(nb * n * rows, dtype=cp.float32)
    # The check: the default shape, against numpy on 64 rows.
    launch, _ = launcher(n, xh, xs, xmax, y, part, 4, 2, 3)
    launch(0)
    got = y.get().reshape(n, rows)
    rl = list(range(0, rows, rows // 64))[:64]
    w = dequant_rows(host[0], rl)
    xf = xh.get().astype(np.float64)
    want = xf @ w.T
    mag = np.abs(xf) @ np.abs(w).T
    worst = float(np.max(np.abs(got[:, rl] - want) / (mag * 2.0 ** -18)))
    print(f"\nn={n}: vs numpy, largest difference / (2^-18 sum |w||x|) = {worst:.3f} ({'ok' if worst <= 1 else 'FAILED'})")
    base = got.copy()
    for xreg, nt8 in [(False, False), (True, False), (False, True)]:
        if nt8 and n <= 32:
            continue
        for wr in [2, 4, 8]:
            for stages in [2, 3, 4]:
                for wave in [1, 2, 3, 6]:
                    launch, (name, wt, wr_, smem, ksplit) = launcher(n, xh, xs, xmax, y, part, wr, stages, wave, xreg, nt8)
                    if wr_ != wr or smem > MAX_SMEM or (xreg and wr < 4):
                        continue
                    t = graph_time(launch, copies)
                    launch(0)
                    same = np.array_equal(y.get().reshape(n, rows), base) if wave == 3 else None
                    print(f"n={n} {name} WR={wr} stages={stages} wave={wave} (ksplit {ksplit}, {smem} B, {32 * wr * wt} threads): "
                          f"{t:7.2f} us {mat_bytes / t / 1e3:6.0f} GB/s" + ("" if same is None else f"  same bits as default: {same}"))
