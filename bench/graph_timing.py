"""Microseconds per call of a GPU function as the engine runs it: `reps` calls captured in one
CUDA graph (launch gaps as in the decode graphs), replayed; the median of 5 timings. On CPU, plain
calls timed on the host."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.platform.device_timing import event_times_ms  # noqa: E402


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

    def calls():
        for _ in range(reps):
            fn()
    return statistics.median(event_times_ms(calls, 5, graphed=True)) * 1000 / reps
