"""From how many rows each 4-bit layer's product goes through the Triton GEMM over tinygemm's
layout instead of tinygemm itself: measured once at load, per layer shape, on this GPU (outside
the reproducible mode the kernel may be chosen per row count by measurement).

tinygemm's time grows with every row, the GEMM's barely below a tile: at 64 rows the
GEMM took 210 us for a 7B's gate/up against tinygemm's 597, but 458 against 305 for its down
product (docs/benchmark-log.md, 2026-12-03). So a fixed row count serves neither: each shape gets
the smallest of the batched step's row counts from which the GEMM was faster at that count and at
every larger one. Both read the same weights, so nothing is copied; before this runs, or where
the GEMM does not check out on the device, the GEMM takes rows above TINYGEMM_MAX_ROWS as before.
HEARTH_INT4_ROWS=fixed (engine/config/overrides.py) turns it off.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable

import torch

from engine.platform.device_timing import event_times_ms
from engine.quant.int4_linear import Int4Linear, fused_matmul, tinygemm_gemm_ok

ROWS = (16, 32, 64)  # the batched step's captured sizes where either kernel can win
REPS = 10


def _cuda_us(fn: Callable[[], object]) -> float:
    """Median microseconds of one call (after a warm-up that compiles)."""
    return statistics.median(event_times_ms(fn, REPS)) * 1000


def gemm_from(times: dict[int, tuple[float, float]], default: int) -> int:
    """rows -> (tinygemm us, GEMM us) -> the smallest row count from which the GEMM was faster
    at it and at every larger one measured; `default` where it never was at the largest."""
    start = default
    for rows in sorted(times, reverse=True):
        tiny, gemm = times[rows]
        if gemm >= tiny:
            break
        start = rows
    return start


def _times(m: Int4Linear, timer) -> dict[int, tuple[float, float]]:
    """rows -> (tinygemm us, GEMM us) for layer m."""
    sz = m.scales_zeros.contiguous()
    times = {}
    for rows in ROWS:
        x = torch.randn(rows, m.in_features, device=sz.device, dtype=sz.dtype)
        times[rows] = (timer(lambda: m._packed_mm(x, sz)),  # noqa: B023 - called right here
                       timer(lambda: fused_matmul(x, m.packed, sz, m.group_size)))  # noqa: B023
    return times


def tune(modules: Iterable[object], timer: Callable[[Callable[[], object]], float] = _cuda_us
         ) -> str:
    """Set `gemm_rows` on every tinygemm Int4Linear among `modules` (a step's fused q/k/v,
    gate/up, o, down, lm_head), timing one layer per (N, K, G); a note for the load event."""
    shapes: dict[tuple[int, int, int], list[Int4Linear]] = {}
    for m in modules:
        if isinstance(m, Int4Linear) and m.kernel == "tinygemm" and m.fused_prefill:
            shapes.setdefault((m.out_features, m.in_features, m.group_size), []).append(m)
    if not shapes or not tinygemm_gemm_ok(str(next(iter(shapes.values()))[0].packed.device)):
        return ""
    chosen = []
    for (N, K, _), mods in shapes.items():
        try:
            start = gemm_from(_times(mods[0], timer), mods[0].gemm_rows)
        except Exception as e:  # noqa: BLE001 - a failed timing: this shape keeps the default
            chosen.append(f"{N}x{K}: not measured ({type(e).__name__})")
            continue
        for mod in mods:
            mod.gemm_rows = start
        chosen.append(f"{N}x{K}: {start}" if start <= ROWS[-1] else f"{N}x{K}: none")
    return ("int4 products through the Triton GEMM from (rows, measured at load): "
            + ", ".join(chosen))
