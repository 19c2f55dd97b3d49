"""The 64-concurrent row at several step token budgets (the batch run's budget is the
session's prefill_chunk, the planner's largest prefill pass): one load, then `hearth bench
--concurrency 64 --no-peer`'s measurement per budget, each beside its own batch-1 round.

    python3 bench/budget_sweep.py --model bench/qwen2.5-7b --budgets 4096 8192
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_session import load_random  # noqa: E402  (beside this script)

from engine.service.start import start  # noqa: E402
from engine.tools.bench.concurrent import measure  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--quant", default="bf16")
    p.add_argument("--budgets", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    session = load_random(a.model, a.quant, 512, 256, rows=a.concurrency)
    planned = session.prefill_chunk
    for budget in a.budgets:
        session.prefill_chunk = budget
        engine, thread = start("hearth-bench-engine", max_waiting=a.concurrency)
        engine.session = session
        r = measure(engine, thread, [a.concurrency], 512, 256, a.repeats, peer=False)
        one, many = r.batch_1, r.rows[0]
        print(json.dumps({"budget": budget, "planned_chunk": planned,
                          "batch_1": one.aggregate_decode_tokens_per_s,
                          "aggregate": many.aggregate_decode_tokens_per_s,
                          "x_batch_1": round(many.aggregate_decode_tokens_per_s
                                             / one.aggregate_decode_tokens_per_s, 2),
                          "row": asdict(many), "preemptions": r.preemptions}), flush=True)


if __name__ == "__main__":
    main()
