"""Per-launch time of GPU work replayed from a CUDA graph (no Python in the timed loop), for the
benchmarks in this folder."""
import cupy as cp


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
