"""Timing GPU work where the engine picks between kernels by measurement at load
(quant/int4_rows.py, quant/int4_cuda.py) and in the benchmark scripts: CUDA events around each
run, after a warm-up that compiles; optionally the work captured once as a CUDA graph and
replayed, for launches of a few microseconds whose host work would otherwise be what is timed."""

from __future__ import annotations

from collections.abc import Callable

import torch


def captured(fn: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object]:
    """fn() warmed up on a side stream (as CUDA graphs want), then captured: (graph, fn's
    output, which each replay rewrites)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def event_times_ms(fn: Callable[[], object], reps: int, graphed: bool = False
                   ) -> list[float]:
    """Milliseconds of device time of each of `reps` runs of fn (graphed: replays of one
    capture of it)."""
    if graphed:
        fn = captured(fn)[0].replay
    fn()  # the warm-up (graphed: the first replay)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times
