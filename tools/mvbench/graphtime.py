"""Per-launch time of GPU work replayed from a CUDA graph (no Python in the timed loop), and the
random Q4_K matrices, for the benchmarks in this folder."""
import cupy as cp
import numpy as np


def cdiv(a, b):
    return -(-a // b)


def random_q4k(rng, rows, nb):
    """A Q4_K matrix of rows x nb blocks as host bytes ([rows * nb, 144]): random codes and
    scales, d and dmin small positive halves (sane block scales, never zero)."""
    b = rng.integers(0, 256, size=(rows * nb, 144), dtype=np.uint8)
    b[:, 0:2] = (rng.random((rows * nb, 1)) * 0.01 + 0.001).astype(np.float16).view(np.uint8)
    b[:, 2:4] = (rng.random((rows * nb, 1)) * 0.01 + 0.001).astype(np.float16).view(np.uint8)
    return b


def graph_time(launch, n_copies, reps=30):
    """launch(i) issues launch i on the current stream, reading weight copy i % n_copies (copies
    rotate so each launch streams its weights from HBM, not L2). Returns microseconds per launch."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for i in range(3):
            launch(i % n_copies)
        stream.synchronize()
        stream.begin_capture()
        for i in range(reps):
            launch(i % n_copies)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record(stream)
        graph.launch(stream)
        e.record(stream)
        e.synchronize()
    return cp.cuda.get_elapsed_time(s, e) / reps * 1000.0
