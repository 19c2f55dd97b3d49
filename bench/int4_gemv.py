"""The decode kernel (kernels/int4_gemv_kernel.py) against the "mma" kernel,
tinygemm and bf16 at the Qwen2.5-7B (or Llama-3.1-8B) shapes, 1 to 8 rows: its default launch
and, with --splits, other splits of K (with --xpre, x loaded at use), each checked against
the dequantized reference first. Timed as int4_mma.py times (CUDA-graph replays cycling through
copies larger than the L2). One JSON line a measurement (stderr and --out), the best per shape,
rows and kernel as a table.
Usage (repo root, on the GPU): python3 bench/int4_gemv.py [--rows 1 4 8]
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

from engine.kernels import int4_gemv_kernel, int4_mma_kernel  # noqa: E402
from engine.quant.int4_linear import Int4Linear  # noqa: E402

G = 128
TOL = 1e-2
COPIES_BYTES = 400 << 20


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--model", default="qwen2.5-7b", choices=sorted(SHAPES))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--shapes", nargs="+", default=None)
    p.add_argument("--splits", action="store_true", help="other launch constants too")
    p.add_argument("--xpre", action="store_true", help="x loaded at use too (XPRE=0)")
    p.add_argument("--nf4", action="store_true", help="the NF4 codebook variant instead of AWQ")
    p.add_argument("--lut", action="store_true", help="NF4: 0-4 words a k-group by shared table")
    p.add_argument("--glu", action="store_true",
                   help="gate/up only: SiLU * up in the gemv against the gemv, then silu_mul")
    args = p.parse_args()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    log = SweepLog(args.out)
    for name, N, K in SHAPES[args.model]:
        if args.shapes and name not in args.shapes:
            continue
        if args.nf4:
            nf4_shape(log, args, name, N, K)
            continue
        codes, zeros, scales, w, nbytes, n_copies = random_awq_layer(N, K, G, dev, COPIES_BYTES)
        g = torch.Generator().manual_seed(1)
        first = Int4Linear.from_codes(codes, zeros, scales, None, dtype, dev, "mma")
        layers = [(first.packed, first.scales_zeros)] + [
            (first.packed.data.clone(), first.scales_zeros.data.clone())
            for _ in range(n_copies - 1)]
        tg = Int4Linear.from_codes(codes, zeros, scales, None, dtype, dev, "tinygemm")
        tg_sz = tg.scales_zeros.contiguous()
        tgs = [tg.packed] + [tg.packed.clone() for _ in range(n_copies - 1)]
        wb = w.to(dtype)
        wbs = [wb, wb.clone()]
        for M in args.rows:
            x = torch.randn(M, K, generator=g).to(dev, dtype)
            ref = x.float() @ w.t()
            cands = [("bf16", {}, cycling(lambda W: F.linear(x, W), wbs), 2 * N * K),  # noqa: B023
                     ("tinygemm", {}, cycling(lambda P: torch.ops.aten._weight_int4pack_mm(
                         x, P, G, tg_sz), tgs), nbytes),  # noqa: B023
                     ("mma", {}, cycling(lambda L: int4_mma_kernel.matmul(
                         x, L[0], L[1], G), layers), nbytes)]  # noqa: B023
            for v in launches(args, int4_gemv_kernel.variant(G, N, K)):
                cands.append(("gemv" if v == int4_gemv_kernel.variant(G, N, K) else "gemv_sweep",
                              v, cycling(lambda L, v=v: int4_gemv_kernel.matmul(
                                  x, L[0], L[1], G, v), layers), nbytes))  # noqa: B023
            if args.glu:  # the MLP's input instead of the product
                cands = glu_candidates(x, layers, nbytes)
                ref = F.silu(ref[:, :N // 2]) * ref[:, N // 2:]
            for kernel, cfg, fn, nb in cands:
                row = dict(shape=name, N=N, K=K, M=M, kernel=kernel, config=cfg)
                check_and_time(log, row, fn, ref, nb, 2 * n_copies if kernel != "bf16" else 6,
                               time_us, TOL)
        del layers, tgs, wbs, first, tg
        torch.cuda.empty_cache()
    print(log.table())
    return 0


def glu_candidates(x, layers, nbytes: int) -> list:
    """A decode step's gate/up then SiLU * up: two launches, or the gemv's one (glu)."""
    from engine.kernels.fused_ops_kernel import silu_mul

    return [("gemv+silu_mul", {}, cycling(lambda L: silu_mul(int4_gemv_kernel.matmul(
                x, L[0], L[1], G)), layers), nbytes),
            ("gemv_glu", {}, cycling(lambda L: int4_gemv_kernel.matmul(
                x, L[0], L[1], G, glu=True), layers), nbytes)]


def launches(args, base: dict) -> list[dict]:
    """The default launch first, then (--splits, --xpre, --lut) the others swept."""
    splits = [(base["S"], base["SPLITS"])] + ([
        (s, k) for s, k in itertools.product((4, 8, 16), (1, 2, 4, 8))
        if s * k <= 32 and (s, k) != (base["S"], base["SPLITS"])] if args.splits else [])
    pre = [base["XPRE"]] + ([1 - base["XPRE"]] if args.splits or args.xpre else [])
    luts = [base["LUT"]] + ([n for n in range(5) if n != base["LUT"]] if args.lut else [])
    return [dict(base, S=s, SPLITS=k, XPRE=p, LUT=n)
            for (s, k), p, n in itertools.product(splits, pre, luts)]


def nf4_shape(log: SweepLog, args, name: str, N: int, K: int) -> None:
    """The codebook variant at one shape: random codes and absmax (quant/nf4_linear.py's layer),
    the gemv's launches against its dequantized weights."""
    from engine.quant.nf4_linear import BLOCK, Nf4Linear

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(2)
    codes = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    absmax = torch.rand(N, K // BLOCK, generator=g) + 0.5
    lin = Nf4Linear.from_codes_absmax(codes.to(dev), absmax.to(dev), None)
    w = lin.dequantize().float()
    nbytes = N * K // 2 + (K // BLOCK) * N * 2
    copies = [(lin.packed, lin.scales_zeros)] + [
        (lin.packed.clone(), lin.scales_zeros.clone())
        for _ in range(max(1, min(24, COPIES_BYTES // nbytes)) - 1)]
    for M in args.rows:
        x = torch.randn(M, K, generator=g).to(dev, torch.bfloat16)
        ref = x.float() @ w.t()
        base = int4_gemv_kernel.variant(BLOCK, N, K, codebook=True)
        for v in launches(args, base):
            fn = cycling(lambda L, v=v, x=x: int4_gemv_kernel.matmul(
                x, L[0], L[1], BLOCK, v, codebook=True), copies)
            row = dict(shape=name, N=N, K=K, M=M, kernel="nf4" if v == base else "nf4_sweep",
                       config=v)
            check_and_time(log, row, fn, ref, nbytes, 2 * len(copies), time_us, TOL)
    del copies, lin
    torch.cuda.empty_cache()


if __name__ == "__main__":
    raise SystemExit(main())
