"""The "mma" int4 kernel (kernels/int4_mma_kernel.py, tensor cores) and its dense path
(quant/int4_cuda.py) against tinygemm and bf16 cuBLAS at the Qwen2.5-7B (or Llama-3.1-8B) linear
shapes: launch constants swept where the kernel takes the rows, the dense path's slice size past
them, and the dequantizing alone. Each candidate is checked against the dequantized reference
first. Times are CUDA-graph replays cycling through enough copies of the layer that its weights
come from memory, not the L2, as in a decode step. One JSON line per measurement (stderr and
--out); the best of each kernel per shape and row count as a markdown table on stdout with the
weight bytes read per second (int4 codes + bf16 scales and offsets; bf16's own 2 bytes a weight).
Usage (repo root, on the GPU): python3 bench/int4_mma.py [--out F] [--rows 1 16]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from awq_speed import SHAPES  # noqa: E402  (beside this script)
from graph_timing import time_us  # noqa: E402
from sweep_log import SweepLog, check_and_time, cycling, random_awq_layer  # noqa: E402

from engine.kernels import int4_dequant_kernel, int4_mma_kernel  # noqa: E402
from engine.quant import int4_cuda  # noqa: E402
from engine.quant.int4_linear import Int4Linear  # noqa: E402

G = 128
TOL = 1e-2
COPIES_BYTES = 400 << 20  # weights cycled through per timing: several times the L2


def mma_variants(M: int, N: int, K: int) -> list[dict]:
    base = int4_mma_kernel.variant(M, G, N, K)
    return [dict(base, R=r, S=s, SPLITS=k, U=u)
            for r, s, k, u in itertools.product((2, 4), (4, 8), (1, 4), (1, 2, 4))
            if (r, s, k, u) != (base["R"], base["S"], base["SPLITS"], base["U"])]


def dense_with(chunk_bytes):
    def run(x, lin):
        int4_cuda.CHUNK_BYTES = chunk_bytes
        return int4_cuda.matmul(x, lin.packed, lin.scales_zeros, G)
    return run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--model", default="qwen2.5-7b", choices=sorted(SHAPES))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64, 512, 4096])
    p.add_argument("--shapes", nargs="+", default=None)
    p.add_argument("--no-sweep", action="store_true", help="the default launch constants only")
    args = p.parse_args()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    chunk_bytes = int4_cuda.CHUNK_BYTES
    log = SweepLog(args.out)
    record = log.record

    for name, N, K in SHAPES[args.model]:
        if args.shapes and name not in args.shapes:
            continue
        codes, zeros, scales, w, int4_bytes, n_copies = random_awq_layer(N, K, G, dev, COPIES_BYTES)
        g = torch.Generator().manual_seed(1)
        tg = Int4Linear.from_codes(codes, zeros, scales, None, dtype, dev, "tinygemm")
        tg_sz = tg.scales_zeros.contiguous()
        tgs = [tg.packed.clone() for _ in range(n_copies)]
        del tg
        layers = {}
        for kname in ("mma",):
            first = Int4Linear.from_codes(codes, zeros, scales, None, dtype, dev, kname)
            exact = torch.equal(int4_dequant_kernel.dequant(
                first.packed, first.scales_zeros, G, 0, N,
                torch.empty(N * K, dtype=dtype, device=dev)), first.dequantize())
            record(shape=name, N=N, K=K, M=0, kernel=f"{kname}_dequant_equals_reference",
                   ok=exact)
            layers[kname] = [first] + [Int4Linear(K, N, G, kname, first.packed.data.clone(),
                                                  first.scales_zeros.data.clone())
                                       for _ in range(n_copies - 1)]
        wb = w.to(dtype)
        wbs = [wb] + [wb.clone() for _ in range(min(3, n_copies) - 1)]
        buf = torch.empty(N * K, dtype=dtype, device=dev)
        cands_all = [(f"{kname}_dequant_whole", {}, cycling(
            lambda L, n=N, b=buf: int4_dequant_kernel.dequant(L.packed, L.scales_zeros, G, 0, n,
                                                              b),
            layers[kname]), int4_bytes + 2 * N * K) for kname in ("mma",)]
        for M in args.rows:
            x = torch.randn(M, K, generator=g).to(dev, dtype)
            ref = x.float() @ w.t()
            cands = [("bf16", {}, cycling(lambda W: F.linear(x, W), wbs), 2 * N * K),  # noqa: B023
                     ("tinygemm", {}, cycling(
                         lambda P: torch.ops.aten._weight_int4pack_mm(x, P, G, tg_sz),  # noqa: B023
                         tgs), int4_bytes)]
            if M <= int4_mma_kernel.MMA_MAX_ROWS:
                variants = [int4_mma_kernel.variant(M, G, N, K)] + (
                    [] if args.no_sweep or M not in (1, 16) else mma_variants(M, N, K))
                for v in variants:
                    cands.append(("mma", v, cycling(
                        lambda L, v=v: int4_mma_kernel.matmul(x, L.packed,  # noqa: B023
                                                              L.scales_zeros, G, v),
                        layers["mma"]), int4_bytes))
            if M > int4_mma_kernel.MMA_MAX_ROWS:
                for cb in (160 << 20, 2 * N * K):
                    run = dense_with(cb)
                    cands.append(("dense_mma", {"chunk_mb": round(cb / 2**20, 1)}, cycling(
                        lambda L, run=run: run(x, L), layers["mma"]), int4_bytes))  # noqa: B023
            if M == args.rows[0]:
                cands += cands_all
            for kernel, cfg, fn, nbytes in cands:
                row = dict(shape=name, N=N, K=K, M=M, kernel=kernel, config=cfg)
                check_and_time(log, row, fn, ref, nbytes, 2 * n_copies if kernel != "bf16" else 6,
                               time_us, TOL, check=not kernel.startswith("dequant"))
        del tgs, layers, wbs, buf
        torch.cuda.empty_cache()
    int4_cuda.CHUNK_BYTES = chunk_bytes  # the dense runs set their own
    print(log.table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
