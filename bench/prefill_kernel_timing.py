"""On a GPU: one layer's decode-attention kernel over a short prefill chunk (Qwen2.5-7B's heads:
28 query, 4 KV, dim 128) against a long cached context, the case of a reused conversation's new
turn, and a one-token step beside it. Times the kernel module it is given (default: the
engine's), so two versions of the kernel compare in one process:

    python3 bench/prefill_kernel_timing.py [--kernel FILE] [--label NAME]

Prints one JSON line per case: microseconds per call, launches included (CUDA events, median of
5 x 50 calls), and how many versions of the kernel are compiled so far.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.cache.kv_cache import KVCache  # noqa: E402

H, HKV, D = 28, 4, 128


def load(path: str | None):
    if path is None:
        from engine.kernels import decode_attention_kernel
        return decode_attention_kernel
    spec = importlib.util.spec_from_file_location("kernel_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kernel")
    p.add_argument("--label", default="engine")
    a = p.parse_args()
    kernel = load(a.kernel)
    cache = KVCache(1, HKV, D, 8704, "bf16", "cuda")
    cache.reserve(8704)
    g = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randn(1, HKV, 8704, D, device="cuda", generator=g)
    cache.write(0, torch.arange(8704, device="cuda"), k, torch.randn_like(k))
    for T, end, kv_len in ((1, 8000, 8192), (5, 8004, 8192), (51, 8058, 8192), (50, 4050, 4096),
                           (64, 4096, 4096), (98, 2098, 2176), (300, 8300, 8704)):
        q = torch.randn(1, H, T, D, device="cuda", generator=g, dtype=torch.bfloat16)
        pos = torch.arange(end - T, end, device="cuda")
        args = (q, cache.layer(0), pos, kv_len, D ** -0.5)
        kernel.decode_attention(*args)  # compile
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(50):
                kernel.decode_attention(*args)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1000 / 50)
        compiled = sum(len(c[0]) for c in kernel.partial_softmax.device_caches.values())
        print(json.dumps(dict(label=a.label, T=T, end=end, kv_len=kv_len,
                              us=round(statistics.median(times), 1), compiled=compiled)),
              flush=True)


if __name__ == "__main__":
    main()
