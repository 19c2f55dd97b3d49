"""On a GPU: one layer's decode attention (T = 1) at the Llama-3.1-8B shape (32 query heads, 8 KV
heads, head_dim 128), per KV length: SDPA over a bf16 cache as the fused step calls it (masked,
grouped-query rows), and the Triton split-context kernel over bf16, int8 and fp8 caches.

Each variant is captured in a CUDA graph of 50 calls and replayed; reported: microseconds per
call, and the bytes the call must read (K and V of every position, scales included) over that
time; also the relative error against the PyTorch reference. --sweep also times the kernel's
settings at the longest length: "launch" (keys per iteration, programs per SM, warps, stages, row
tiles, how the codes are widened) or "chunk" (the block table read a chunk at a time, under
each).
Prints markdown tables, and one JSON object a line to --json. Usage (repository root):
    python3 bench/kv_attention_speed.py [--lengths 1024 8192 32768]
        [--sweep launch|chunk] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graph_timing import time_us  # noqa: E402  (beside this script)

from engine.attention import decode_attention  # noqa: E402
from engine.cache import kv_arena
from engine.cache.kv_cache import KVCache  # noqa: E402

H, HKV, D = 32, 8, 128
CALLS = 50
VARIANTS = (("bf16", "sdpa"), ("bf16", "triton"), ("int8", "triton"), ("fp8", "triton"))
# The "launch" grid as timed at 192459b, from the defaults of then
# (64-row tiles, the table read a tile at a time, quantized codes converted to bf16), pinned here
# because the defaults have since moved to what it and the "chunk" grid found
BEFORE = {"bf16": dict(block_m=64, chunk=0, block_n=64, num_stages=2),
          "int8": dict(block_m=64, chunk=0, block_n=128, num_stages=3, fp16_dots=False,
                       asm=False)}
BEFORE["fp8"] = BEFORE["int8"]
# 16-row tiles (mma.sync) need far fewer registers than 64-row ones (wgmma: 251 a thread for
# int8, two programs an SM; 80-150 with 16 rows, three or four): (block_n, warps, stages)
LAUNCH16 = ((32, 8, 3), (32, 4, 3), (64, 4, 3), (64, 8, 3), (64, 8, 2), (128, 8, 2), (128, 8, 3))
# how the codes reach the tensor cores (decode_attention_kernel.py): widened to bf16 by
# conversion, or to fp16 (int8 by bit operations in PTX; fp8 by its conversion)
WIDEN = {"int8": ({}, {"fp16_dots": True, "asm": True}), "fp8": ({}, {"fp16_dots": True}),
         "bf16": ({},)}


def chunk_configs(kv_dtype: str) -> list[dict]:
    """The default, then the table read a chunk of blocks at a time (decode_attention_kernel.py)
    under 64-row tiles (3 stages) and 16-row tiles (2/3 stages), 4 warps."""
    widen = {"int8": {"fp16_dots": True, "asm": True}, "fp8": {"fp16_dots": True}}.get(kv_dtype,
                                                                                      {})
    launches = [(64, n, 4, 3) for n in (64, 128)] + [
        (16, n, 4, st) for n in (64, 128) for st in (2, 3)]  # 8 warps: 50-90% slower over
    # int8, as swept on a GPU
    return [{}, dict(widen)] + [dict(chunk=c, block_m=m, block_n=n, num_warps=w, num_stages=st,
                                     **widen)
                                for c in (32, 64) for m, n, w, st in launches]


def sweep_configs(kv_dtype: str) -> list[dict]:
    """BEFORE with each way of widening (int8 also by bit operations in Triton), then 16-row
    tiles under each launch setting, 2 and 4 programs an SM, each way of widening."""
    first = [dict(w) for w in WIDEN[kv_dtype]]
    if kv_dtype == "int8":
        first.append({"fp16_dots": True})
    launches = LAUNCH16 if kv_dtype != "fp8" else LAUNCH16[::2]
    rest = [dict(block_m=16, block_n=n, num_warps=w, num_stages=st, waves=waves, **widen)
            for widen in WIDEN[kv_dtype] for n, w, st in launches for waves in (2, 4)]
    return [{**BEFORE[kv_dtype], **c} for c in first + rest]


def sdpa(q, kv, pos, kv_len, scaling, config=None):
    """FamilyStep.attend's SDPA path: the G heads of a KV head as G query rows, a mask from pos,
    over a contiguous copy of the paged blocks (gathered through the table: timed with it)."""
    mask = (torch.arange(kv_len, device=q.device) <= pos)[None, None, None, :]
    qg = q.reshape(1, HKV, H // HKV, D)  # [1, H_kv, G, D]
    k, v = kv_arena.gather(*kv, kv_len, kv.k.dtype)  # [1, H_kv, kv_len, D]
    return F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scaling)


def triton_kernel(q, kv, pos, kv_len, scaling, config=None):
    from engine.kernels import decode_attention_kernel

    return decode_attention_kernel.decode_attention(q, kv, pos, kv_len, scaling, config)


def one(n: int, kv_dtype: str, impl: str, config: dict | None = None) -> dict:
    """Time one variant at KV length n; the query sits at the last position (reads all n)."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(n)
    q = torch.randn(1, H, 1, D, device=dev, generator=g).bfloat16()
    k, v = torch.randn(2, 1, HKV, n, D, device=dev, generator=g)
    pos = torch.tensor([n - 1], device=dev)
    cache = KVCache(1, HKV, D, n, kv_dtype, dev)
    cache.reserve(n)
    cache.write(0, torch.arange(n, device=dev), k, v)
    kv, scaling = cache.layer(0), D ** -0.5
    fn = sdpa if impl == "sdpa" else triton_kernel
    row = dict(kv_len=n, kv_dtype=kv_dtype, impl=impl, config=config or {},
               bytes=cache.num_bytes)
    try:
        out = fn(q, kv, pos, n, scaling, config)
        ref = decode_attention.reference(q.float(), kv, pos, n, scaling)
        row["rel_err_vs_reference"] = ((out.float().reshape(ref.shape) - ref).norm()
                                       / ref.norm()).item()
        row["us"] = round(time_us(lambda: fn(q, kv, pos, n, scaling, config), CALLS), 2)
        row["gb_per_s"] = round(row["bytes"] / row["us"] / 1e3, 1)
    except Exception as e:  # report and go on: one variant must not hide the others
        row["error"] = f"{type(e).__name__}: {e}"[:300].replace("\n", " ")
    return row


def table(rows: list[dict], with_config: bool) -> str:
    head = "| KV length | cache | kernel |" + (" settings |" if with_config else "")
    lines = [head + " us per call | bytes read | GB/s | rel. error vs reference |",
             "|---" * (7 + with_config) + "|"]
    for r in rows:
        cfg = f" {r['config'] or 'default'} |" if with_config else ""
        if "error" in r:
            lines.append(f"| {r['kv_len']:,} | {r['kv_dtype']} | {r['impl']} |{cfg} failed: "
                         f"{r['error']} ||||")
            continue
        lines.append(f"| {r['kv_len']:,} | {r['kv_dtype']} | {r['impl']} |{cfg} {r['us']} | "
                     f"{r['bytes'] / 2**20:.1f} MiB | {r['gb_per_s']:,} | "
                     f"{r['rel_err_vs_reference']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 8192, 32768])
    p.add_argument("--sweep", choices=("launch", "chunk"),
                   help="also time the kernel's settings")
    p.add_argument("--dtypes", nargs="+", default=["int8", "bf16", "fp8"],
                   help="the caches --sweep times")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    rows = [one(n, kv, impl) for n in args.lengths for kv, impl in VARIANTS]
    print(f"Decode attention, one layer, T = 1, {H} query / {HKV} KV heads, head_dim {D}, "
          f"{torch.cuda.get_device_name()}; CUDA graph of {CALLS} calls, best of 5\n", flush=True)
    print(table(rows, False), flush=True)
    if args.sweep:  # the quantized caches, then bf16 under 16-row tiles; each row printed
        # as it comes, so a run cut short by a timeout still reports what it timed
        sweep = []
        for kv in args.dtypes:
            grid = {"launch": sweep_configs, "chunk": chunk_configs}[args.sweep]
            for cfg in grid(kv):
                sweep.append(one(max(args.lengths), kv, "triton", cfg))
                print(table(sweep[-1:], True).splitlines()[-1], flush=True)
        sweep.sort(key=lambda r: (r["kv_dtype"], r.get("us", float("inf"))))
        print("\nsorted:\n" + table(sweep, True), flush=True)
        rows += sweep
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
