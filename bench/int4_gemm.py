"""The Triton GEMM over tinygemm's int4 layout (kernels/int4_gemm_kernel.py) against
tinygemm itself, the unpack-then-cuBLAS path it replaces above 64 rows, and bf16 cuBLAS, at the
Qwen2.5-7B and Llama-3.1-8B linear shapes and 1 to 4,096 rows: microseconds per call (CUDA-graph
replays, graph_timing.py), effective weight GB/s and TFLOPS, each checked against the dequantized
reference first; then the GEMM's tiles swept per row count. One JSON line per measurement on
stderr and in --out; a markdown table on stdout.
Usage (repo root, on the GPU): python3 bench/int4_gemm.py [--out FILE] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from awq_speed import SHAPES  # noqa: E402  (beside this script)
from graph_timing import time_us  # noqa: E402

from engine.kernels.int4_gemm_kernel import default_config  # noqa: E402
from engine.quant import awq_format  # noqa: E402
from engine.quant.int4_linear import Int4Linear, fused_matmul  # noqa: E402

ROWS = (1, 4, 16, 32, 64, 128, 512, 4096)
G = 128
TOL = 1e-2


def unpack_mm(x, lin):
    return F.linear(x, lin.dequantize())


def configs(M: int, quick: bool) -> list[dict]:
    ms = [b for b in (16, 32, 64, 128) if b <= max(16, M)][-2:]
    out = []
    for bm in ms:
        for bn in ((64, 128) if quick else (64, 128, 256)):
            for warps in ((4, 8) if quick else (4, 8)):
                for stages in ((3,) if quick else (2, 3, 4)):
                    out.append(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--models", nargs="+", default=list(SHAPES))
    args = p.parse_args()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    rows_out = []
    out = open(args.out, "a") if args.out else None

    def record(**row):
        rows_out.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        if out:
            print(json.dumps(row), file=out, flush=True)

    for model in args.models:
        for name, N, K in SHAPES[model]:
            g = torch.Generator().manual_seed(0)
            codes = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
            zeros = torch.randint(0, 16, (K // G, N), generator=g, dtype=torch.uint8)
            scales = torch.rand(K // G, N, generator=g) * 0.002 + 0.003
            w = awq_format.dequantize(codes, zeros, scales).to(dev)
            lin = Int4Linear.from_codes(codes, zeros, scales, None, dtype, dev, "tinygemm")
            wb = w.to(dtype)
            int4_bytes = N * K // 2 + (K // G) * N * 4
            for M in ROWS:
                x = torch.randn(M, K, generator=g).to(dev, dtype)
                ref = x.float() @ w.t()
                cands = {"bf16": (partial(F.linear, x, wb), 2 * N * K),
                         "tinygemm": (partial(torch.ops.aten._weight_int4pack_mm, x, lin.packed,
                                              G, lin.scales_zeros), int4_bytes),
                         "unpack+cublas": (partial(unpack_mm, x, lin), int4_bytes),
                         "triton-gemm": (partial(fused_matmul, x, lin.packed,
                                                 lin.scales_zeros, G), int4_bytes)}
                for kernel, (fn, nbytes) in cands.items():
                    try:
                        err = ((fn().float() - ref).norm() / ref.norm()).item()
                        us = time_us(fn, 20 if M <= 16 else 5, True)
                        record(model=model, shape=name, N=N, K=K, rows=M, kernel=kernel,
                               us=round(us, 2), gb_per_s=round(nbytes / us / 1e3, 1),
                               tflops=round(2 * M * N * K / us / 1e6, 1), rel_err=round(err, 5),
                               ok=err < TOL,
                               config=default_config(M, N) if kernel == "triton-gemm" else None)
                    except Exception as e:  # a failing candidate is a finding
                        record(model=model, shape=name, N=N, K=K, rows=M, kernel=kernel,
                               error=f"{type(e).__name__}: {e}"[:300])
                best = None
                for cfg in configs(M, args.quick):
                    try:
                        fn = partial(fused_matmul, x, lin.packed, lin.scales_zeros, G, cfg)
                        if ((fn().float() - ref).norm() / ref.norm()).item() >= TOL:
                            continue
                        us = time_us(fn, 20 if M <= 16 else 5, True)
                    except Exception:  # a config Triton cannot build here
                        continue
                    if best is None or us < best[0]:
                        best = (us, cfg)
                if best:
                    record(model=model, shape=name, N=N, K=K, rows=M, kernel="triton-gemm-best",
                           us=round(best[0], 2), gb_per_s=round(int4_bytes / best[0] / 1e3, 1),
                           tflops=round(2 * M * N * K / best[0] / 1e6, 1), config=best[1])
            del lin, w, wb
            torch.cuda.empty_cache()
    print("| model | shape | rows | kernel | us | GB/s | TFLOPS |\n|---|---|---|---|---|---|---|")
    for r in rows_out:
        if "error" in r:
            print(f"| {r['model']} | {r['shape']} | {r['rows']} | {r['kernel']} | failed: "
                  f"{r['error'][:60]} | | |")
        else:
            print(f"| {r['model']} | {r['shape']} | {r['rows']} | {r['kernel']} | {r['us']:.1f}"
                  f" | {r['gb_per_s']:,.0f} | {r['tflops']:,.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
