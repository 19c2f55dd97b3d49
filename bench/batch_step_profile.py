"""Where a 64-row decode step's time goes on the GPU (the 35x target at 64): one engine round of
N requests (random weights), each batched step's wall interval, and the
same round again under torch.profiler: device time per kernel, and the device's busy share of
the decode-only steps (those after every prompt is in).

    python3 bench/batch_step_profile.py --model bench/qwen2.5-7b \
        [--quant bf16] [--rows 64] [--prompt-len 512] [--new-tokens 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from bench_session import load_random, running  # noqa: E402  (beside this script)

from engine.tools.bench.concurrent import run_round  # noqa: E402
from engine.tools.bench.decode import _prompts  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--quant", default="bf16")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    a = p.parse_args()
    session = load_random(a.model, a.quant, a.prompt_len, a.new_tokens, rows=a.rows)
    vocab = session.lm.model.config.vocab_size
    ends: list[tuple[float, bool]] = []  # (clock, every row decoding and no prefill)
    with running(session, max_waiting=a.rows) as engine:
        run_round(engine, _prompts(a.rows, a.prompt_len, vocab, seed=1), 8)  # graphs, kernels
        batch, step = engine.batch, engine.batch.step

        def timed_step() -> None:  # the engine thread calls it: one entry a batched step
            passes = sum(batch.prefill_passes.values())
            step()
            full = (len(batch.scheduler.running) == a.rows
                    and sum(batch.prefill_passes.values()) == passes)  # all rows, no prefill
            ends.append((time.perf_counter(), full))

        batch.step = timed_step
        r = run_round(engine, _prompts(a.rows, a.prompt_len, vocab, seed=2), a.new_tokens)
        # steps of every row decoding, no prefill, after one like it
        tail = [(b - x) * 1000 for (x, f), (b, g) in zip(ends, ends[1:], strict=False) if f and g]
        print(json.dumps(dict(rows=a.rows, aggregate=r.aggregate_decode_tokens_per_s,
                              itl_p50=r.itl_ms_p50, step_ends=len(ends),
                              full_steps=len(tail), decode_step_ms_p50=statistics.median(tail),
                              decode_step_ms_p10=sorted(tail)[len(tail) // 10],
                              decode_step_ms_p90=sorted(tail)[len(tail) * 9 // 10])), flush=True)
        ends.clear()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run_round(engine, _prompts(a.rows, a.prompt_len, vocab, seed=3), a.new_tokens)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        full = [i for i, (_, f) in enumerate(ends) if f]
        window = ends[full[0]][0], ends[full[-1]][0]
        steps = full[-1] - full[0]
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        if not kernels:
            return
        t0 = min(e.time_range.start for e in kernels)
        # kineto's clock is in us from its own origin; the steps' clock is perf_counter: align
        # the window by the last kernel's end against the last step's end
        last = max(e.time_range.end for e in kernels)
        shift = last - ends[-1][0] * 1e6
        lo, hi = window[0] * 1e6 + shift, window[1] * 1e6 + shift
        busy = sum(max(0, min(e.time_range.end, hi) - max(e.time_range.start, lo))
                   for e in kernels)
        print(json.dumps(dict(profiled_window_ms=(hi - lo) / 1000, device_busy_ms=busy / 1000,
                              busy_share=busy / (hi - lo), steps=steps,
                              busy_ms_per_step=busy / 1000 / max(steps, 1),
                              first_kernel_us=t0)), flush=True)
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12,
                                        max_name_column_width=70))


if __name__ == "__main__":
    main()
