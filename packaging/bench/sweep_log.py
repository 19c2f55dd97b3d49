"""The kernel sweeps' bookkeeping (int4_blocked.py, int4_mma.py): one JSON line per measurement on
stderr and in an optional file, the fastest of each (shape, rows, kernel), those as a markdown
table; and a call that reads another copy of a layer each time (so timings see memory, not L2)."""

from __future__ import annotations

import itertools
import json
import sys


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
