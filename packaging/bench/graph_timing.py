"""Microseconds per call of a GPU function as the engine runs it: `reps` calls captured in one
CUDA graph (launch gaps as in the decode graphs), replayed; the median of 5 timings. On CPU, plain
calls timed on the host."""

from __future__ import annotations

import statistics
import time

import torch


def time_us(fn, reps: int, graphed: bool = True) -> float:
    if not graphed:
        fn()
        t = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            t.append((time.perf_counter() - t0) / reps * 1e6)
        return statistics.median(t)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (autotuning, first launches) off the capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return statistics.median(times)
