"""Issue 25's 64-concurrent row at several step token budgets (the batch run's budget is the
session's prefill_chunk, the planner's largest prefill pass): one load, then `hearth bench
--concurrency 64 --no-peer`'s measurement per budget, each beside its own batch-1 round.

    python3 packaging/bench/budget_sweep.py --model packaging/bench/qwen2.5-7b --budgets 4096 8192
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from types import SimpleNamespace

from engine.tools.bench.concurrent import _load, measure


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--quant", default="bf16")
    p.add_argument("--budgets", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    args = SimpleNamespace(model=a.model, quant=a.quant, kv_dtype="auto", device="auto",
                           prompt_len=512, new_tokens=256, concurrency=[a.concurrency],
                           memory_limit=None, eager=False, compile=False, lm_head="16bit",
                           random_weights=True)
    session = _load(args)
    planned = session.prefill_chunk
    for budget in a.budgets:
        session.prefill_chunk = budget
        r = measure(session, [a.concurrency], 512, 256, a.repeats, peer=False)
        one, many = r.batch_1, r.rows[0]
        print(json.dumps({"budget": budget, "planned_chunk": planned,
                          "batch_1": one.aggregate_decode_tokens_per_s,
                          "aggregate": many.aggregate_decode_tokens_per_s,
                          "x_batch_1": round(many.aggregate_decode_tokens_per_s
                                             / one.aggregate_decode_tokens_per_s, 2),
                          "row": asdict(many), "preemptions": r.preemptions}), flush=True)


if __name__ == "__main__":
    main()
