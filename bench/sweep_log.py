"""The kernel sweeps' bookkeeping (int4_mma.py, int4_gemv.py): one JSON line per measurement on
stderr and in an optional file, the fastest of each (shape, rows, kernel), those as a markdown
table; a random AWQ layer; a call that reads another copy of a layer each time (so timings see
memory, not L2); and one candidate checked against the reference, then timed."""

from __future__ import annotations

import itertools
import json
import sys


def random_awq_layer(N: int, K: int, G: int, device, copies_bytes: int):
    """A random AWQ layer for a sweep: (codes, zeros, scales, its dequantized weight on `device`,
    the int4 bytes a product reads (codes, bf16 scales and offsets), and how many copies of them
    make `copies_bytes`, at most 24)."""
    import torch

    from engine.quant import awq_format

    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    zeros = torch.randint(0, 16, (K // G, N), generator=g, dtype=torch.uint8)
    scales = torch.rand(K // G, N, generator=g) * 0.002 + 0.003
    w = awq_format.dequantize(codes, zeros, scales).to(device)
    nbytes = N * K // 2 + (K // G) * N * 4
    return codes, zeros, scales, w, nbytes, max(1, min(24, copies_bytes // nbytes))


def cycling(fn, copies):
    """fn over the copies in turn: each call reads another copy's weights."""
    it = itertools.cycle(copies)
    return lambda: fn(next(it))


class SweepLog:
    def __init__(self, path: str | None = None):
        self.out = open(path, "a") if path else None  # noqa: SIM115 - open for the whole sweep
        self.best: dict = {}

    def record(self, **row) -> None:
        line = json.dumps(row)
        print(line, file=sys.stderr, flush=True)
        if self.out:
            print(line, file=self.out, flush=True)
        key = (row["shape"], row["M"], row["kernel"])
        if row.get("us") and (key not in self.best or row["us"] < self.best[key]["us"]):
            self.best[key] = row

    def table(self) -> str:
        """The fastest of each (shape, rows, kernel), by shape, rows and time."""
        lines = ["| shape | M | kernel | us | weight GB/s | config |", "|---|---|---|---|---|---|"]
        for (shape, M, kernel), r in sorted(self.best.items(),
                                            key=lambda kv: (kv[0][0], kv[0][1], kv[1]["us"])):
            lines.append(f"| {shape} | {M} | {kernel} | {r['us']} | {r['gbs']} | "
                         f"{r['config'] or ''} |")
        return "\n".join(lines)


def check_and_time(log: SweepLog, row: dict, fn, ref, nbytes: int, reps: int, time_us,
                   tol: float, check: bool = True) -> None:
    """fn's output against `ref` (unless not `check`), then its microseconds a call and weight
    GB/s, recorded; a wrong output or an exception (a variant that does not compile) is recorded
    as the row's error instead."""
    try:
        err = ((fn().float() - ref).norm() / ref.norm()).item() if check else 0.0
        if not err <= tol:  # NaN too
            return log.record(**row, error=f"rel {err:.2e}")
        us = time_us(fn, reps)
    except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
        return log.record(**row, error=f"{type(e).__name__}: {str(e)[:200]}")
    log.record(**row, us=round(us, 2), rel=round(err, 5), gbs=round(nbytes / us / 1e3, 1))
