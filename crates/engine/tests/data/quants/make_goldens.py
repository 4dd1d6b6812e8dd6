#!/usr/bin/env python3
"""Random blocks of every weight format and their dequantization by gguf-py's numpy reference
(gguf.quants, llama.cpp b11434's gguf-py). Regenerate with:
  PYTHONPATH=$LLAMA_CPP_DIR/gguf-py python3 make_goldens.py
Writes <type>.bin (raw blocks) and <type>.f32 (little-endian f32 values) beside this file."""
import os
import numpy as np
from gguf import GGMLQuantizationType as T, quants
from gguf.constants import GGML_QUANT_SIZES

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20261129)
N_BLOCKS = 64

def f16_bytes(v):
    return np.asarray(v, dtype=np.float16).view(np.uint8).reshape(-1, 2)

for t in [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_K, T.Q5_K, T.Q6_K]:
    bs, ts = GGML_QUANT_SIZES[t]
    n = N_BLOCKS * (256 if bs == 1 else 1)
    if t == T.F32:
        raw = rng.standard_normal(n).astype(np.float32).view(np.uint8)
    elif t == T.F16:
        raw = rng.standard_normal(n).astype(np.float16).view(np.uint8)
    elif t == T.BF16:
        raw = (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        blocks = rng.integers(0, 256, size=(n, ts), dtype=np.uint8)
        # Scales: random magnitudes and signs over a wide range, plus zeros and subnormals.
        scale = rng.choice([0.0, 6e-8, 1e-5, 1e-3, 0.02, 0.5, 3.0, 1000.0], size=n) * rng.choice([-1, 1], size=n)
        scale2 = rng.choice([0.0, 1e-4, 2e-3, 0.1], size=n)
        if t in (T.Q8_0, T.Q4_0):
            blocks[:, 0:2] = f16_bytes(scale)
        elif t in (T.Q4_K, T.Q5_K):
            blocks[:, 0:2] = f16_bytes(scale)
            blocks[:, 2:4] = f16_bytes(scale2)
        elif t == T.Q6_K:
            blocks[:, 208:210] = f16_bytes(scale)
        raw = blocks.reshape(-1)
    raw = np.ascontiguousarray(raw).reshape(-1)
    values = quants.dequantize(raw, t).astype(np.float32).reshape(-1)
    name = t.name.lower()
    raw.tofile(os.path.join(HERE, f"{name}.bin"))
    values.tofile(os.path.join(HERE, f"{name}.f32"))
    print(name, raw.size, "bytes ->", values.size, "values")
