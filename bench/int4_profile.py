"""Where one request's time goes with an int4 kernel: a 7B AWQ model with random
weights, one prompt (prefill) and a few decode steps under torch.profiler, after a warm-up round;
the kernels by device time and the host's calls by total time.

    HEARTH_INT4_KERNEL=mma python3 bench/int4_profile.py \
        --model bench/qwen2.5-7b
"""

from __future__ import annotations

import argparse
import sys
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
    p.add_argument("--quant", default="awq")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=16)
    a = p.parse_args()
    session = load_random(a.model, a.quant, a.prompt_len, a.new_tokens)
    vocab = session.lm.model.config.vocab_size
    with running(session) as engine:
        for seed in (1, 2):
            r = run_round(engine, _prompts(1, a.prompt_len, vocab, seed=seed), a.new_tokens)
            print("warm-up round:", r, flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            r = run_round(engine, _prompts(1, a.prompt_len, vocab, seed=3), a.new_tokens)
            torch.cuda.synchronize()
        print("profiled round:", r, flush=True)
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40,
                                        max_name_column_width=60))
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25,
                                        max_name_column_width=60))


if __name__ == "__main__":
    main()
