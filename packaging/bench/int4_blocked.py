"""Issue 28: the blocked int4 kernel (kernels/int4_blocked_kernel.py) against tinygemm, the old
Triton GEMV, the Triton GEMM over tinygemm's layout and bf16 cuBLAS, at the Qwen2.5-7B linear
shapes, 1 to 4,096 rows, its tiles swept. Each candidate is checked against the dequantized
reference first. Times are CUDA-graph replays cycling through enough copies of the layer that
its weights come from memory, not the L2 (50 MB on an H200), as in a decode step where every
layer is another matrix. One JSON line per measurement (stderr and --out); the best of each
kernel per shape and row count as a markdown table on stdout, with the weight bytes read per
second (int4 codes + bf16 scales and offsets; bf16's own 2 bytes a weight).
Usage (repo root, on the GPU): python3 packaging/bench/int4_blocked.py [--out F] [--rows 1 16]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from awq_speed import SHAPES  # noqa: E402  (beside this script)
from graph_timing import time_us  # noqa: E402
from sweep_log import SweepLog, check_and_time, cycling  # noqa: E402

from engine.kernels import int4_kernel  # noqa: E402
from engine.kernels.int4_blocked_kernel import blocked_matmul  # noqa: E402
from engine.quant import awq_format, int4_blocked_layout  # noqa: E402
from engine.quant.int4_linear import Int4Linear, fused_matmul, pack_rows  # noqa: E402

G = 128
TOL = 1e-2
COPIES_BYTES = 400 << 20  # weights cycled through per timing: several times the L2


def blocked_configs(M: int) -> list[dict]:
    if M == 1:
        return [dict(LBN=lbn, BLOCK_M=1, BLOCK_N=lbn, BLOCK_K=bk, num_warps=w, num_stages=3,
                     ACC2D=acc2d)
                for lbn, bk, w, acc2d in itertools.product((8, 32), (256, 512), (2, 4),
                                                           (True, False))]
    if M <= 16:
        return [dict(LBN=lbn, BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=3,
                     TRANS=trans)
                for lbn, bn, bk, trans in itertools.product((16, 32), (32, 64, 128), (64, 128),
                                                            (True, False)) if bn >= lbn]
    return [dict(LBN=32, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=3,
                 TRANS=trans)
            for bm, bn, bk, w, trans in itertools.product((64, 128), (64, 128), (64, 128), (4, 8),
                                                          (True, False))]

def candidates(x, sz, M, N, layouts, tgs, rows_old, wbs, int4_bytes) -> list:
    """(kernel, config, fn, bytes read) for every kernel that takes M rows."""
    K = x.shape[1]
    cands = [("bf16", {}, cycling(lambda W: F.linear(x, W), wbs), 2 * N * K)]
    cands.append(("tinygemm", {}, cycling(
        lambda P: torch.ops.aten._weight_int4pack_mm(x, P, G, sz), tgs), int4_bytes))
    if M <= 16:
        cands.append(("triton_gemv_old", {}, cycling(
            lambda P: int4_kernel.int4_matmul(x, P, sz, G), rows_old), int4_bytes))
    if M >= 64:
        cands.append(("tinygemm_layout_gemm", {}, cycling(
            lambda P: fused_matmul(x, P, sz, G), tgs), int4_bytes))
    for cfg in blocked_configs(M):
        lbn = cfg["LBN"]
        if lbn not in layouts or N % cfg["BLOCK_N"]:
            continue
        kcfg = {k: v for k, v in cfg.items() if k != "LBN"}
        cands.append(("blocked", cfg, cycling(
            lambda P, c=kcfg: blocked_matmul(x, P, sz, G, c), layouts[lbn]), int4_bytes))
    return cands


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64, 512, 4096])
    p.add_argument("--shapes", nargs="+", default=None)
    args = p.parse_args()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    log = SweepLog(args.out)

    for name, N, K in SHAPES["qwen2.5-7b"]:
        if args.shapes and name not in args.shapes:
            continue
        g = torch.Generator().manual_seed(0)
        codes = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
        zeros = torch.randint(0, 16, (K // G, N), generator=g, dtype=torch.uint8)
        scales = torch.rand(K // G, N, generator=g) * 0.002 + 0.003
        w = awq_format.dequantize(codes, zeros, scales).to(dev)
        tg = Int4Linear.from_codes(codes, zeros, scales, None, dtype, dev, "tinygemm")
        sz = tg.scales_zeros.contiguous()
        int4_bytes = N * K // 2 + (K // G) * N * 4
        n_copies = max(1, min(24, COPIES_BYTES // int4_bytes))
        layouts = {lbn: [int4_blocked_layout.pack(codes.to(dev), lbn)
                         for _ in range(n_copies)] for lbn in (8, 16, 32) if N % lbn == 0}
        tgs = [tg.packed.clone() for _ in range(n_copies)]
        rows_old = [pack_rows(codes.to(dev)) for _ in range(n_copies)]
        wb = w.to(dtype)
        wbs = [wb] + [wb.clone() for _ in range(min(3, n_copies) - 1)]
        for M in args.rows:
            x = torch.randn(M, K, generator=g).to(dev, dtype)
            ref = x.float() @ w.t()

            cands = candidates(x, sz, M, N, layouts, tgs, rows_old, wbs, int4_bytes)
            for kernel, cfg, fn, nbytes in cands:
                row = dict(shape=name, N=N, K=K, M=M, kernel=kernel, config=cfg)
                check_and_time(log, row, fn, ref, nbytes, 2 * n_copies if kernel != "bf16" else 6,
                               time_us, TOL)
        del layouts, tgs, rows_old, wbs
        torch.cuda.empty_cache()
    print(log.table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
