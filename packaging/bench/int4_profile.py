"""Where one request's time goes with an int4 kernel (issue 28): a 7B AWQ model with random
weights, one prompt (prefill) and a few decode steps under torch.profiler, after a warm-up round;
the kernels by device time and the host's calls by total time.

    HEARTH_INT4_KERNEL=mma python3 packaging/bench/int4_profile.py \
        --model packaging/bench/qwen2.5-7b
"""

from __future__ import annotations

import argparse
import threading
from types import SimpleNamespace

import torch
from torch.profiler import ProfilerActivity, profile

from engine.service.engine import Engine
from engine.tools.bench.concurrent import _load, run_round
from engine.tools.bench.decode import _prompts


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--quant", default="awq")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=16)
    a = p.parse_args()
    args = SimpleNamespace(model=a.model, quant=a.quant, kv_dtype="auto", device="auto",
                           prompt_len=a.prompt_len, new_tokens=a.new_tokens, concurrency=[1],
                           memory_limit=None, eager=False, compile=False, lm_head="16bit",
                           random_weights=True)
    session = _load(args)
    vocab = session.lm.model.config.vocab_size
    engine = Engine(max_waiting=4)
    engine.session = session
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    try:
        for seed in (1, 2):
            r = run_round(engine, _prompts(1, a.prompt_len, vocab, seed=seed), a.new_tokens)
            print("warm-up round:", r, flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            r = run_round(engine, _prompts(1, a.prompt_len, vocab, seed=3), a.new_tokens)
            torch.cuda.synchronize()
        print("profiled round:", r, flush=True)
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15,
                                        max_name_column_width=60))
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25,
                                        max_name_column_width=60))
    finally:
        engine.stop()
        thread.join(30)


if __name__ == "__main__":
    main()
