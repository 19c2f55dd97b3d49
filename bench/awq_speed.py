"""The int4 kernels at Qwen2.5-7B and Llama-3.1-8B linear shapes: microseconds and
effective GB/s (weight bytes read / time) per call, timed as CUDA-graph replays, each checked
against the dequantized reference first. Candidates: bf16 cuBLAS (the yardstick), torch's
tinygemm, the project's Triton split-K GEMV (default tiles and the best of a sweep), dense
dequantize + cuBLAS (prefill), gptqmodel's AWQ Triton GEMM with its own plan (where a gptqmodel
wheel was carried), and for the lm_head torch's int8 kernel. One JSON line per measurement to
--out, the markdown table to stdout. Runs on the CPU too with --cpu (correctness only, tiny).
Usage (repo root): python3 bench/awq_speed.py [--out FILE] [--quick]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import types
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graph_timing import time_us  # noqa: E402  (beside this script)

from engine.quant import awq_format  # noqa: E402
from engine.quant.int4_linear import Int4Linear, kernel_fits  # noqa: E402
from engine.quant.int8_linear import Int8Linear  # noqa: E402

SHAPES = {  # (name, N, K): fused q/k/v and gate/up, as the decode step runs them
    "qwen2.5-7b": [("qkv", 4608, 3584), ("o", 3584, 3584), ("gate_up", 37888, 3584),
                   ("down", 3584, 18944), ("lm_head", 152064, 3584)],
    "llama-3.1-8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096),
                     ("down", 4096, 14336), ("lm_head", 128256, 4096)],
}
CPU_SHAPES = {"tiny": [("qkv", 384, 256), ("lm_head", 1024, 256)]}
ROWS = (1, 4, 512)  # a decode step, a speculative verify block, a prefill chunk
G = 128
TOL = 1e-2  # bf16 / fp16 outputs: ~3e-3 expected


def gptqmodel_triton():
    """gptqmodel's AWQ Triton GEMM and its planner, imported without gptqmodel's package
    __init__ (which needs its whole dependency tree): the two files need only torch and Triton."""
    spec = importlib.util.find_spec("gptqmodel")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(spec.submodule_search_locations[0])
    for name in ("gptqmodel", "gptqmodel.utils", "gptqmodel.quantization",
                 "gptqmodel.quantization.awq", "gptqmodel.quantization.awq.modules",
                 "gptqmodel.quantization.awq.modules.triton"):
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = m
    gemm = importlib.import_module("gptqmodel.quantization.awq.modules.triton.gemm")
    sched = importlib.import_module("gptqmodel.quantization.awq.modules.triton.scheduler")
    return gemm, sched


def triton_configs(M: int, K: int, quick: bool) -> list[dict]:
    tiles = lambda bk: K // bk
    out = []
    for bn in ((64,) if quick else (32, 64, 128)):
        for bk in ((128,) if quick else (64, 128)):
            for warps in ((4,) if quick else (2, 4, 8)):
                for split in (1, 2, 4, 7, 8, 14, 16, 28, 37):
                    if tiles(bk) % split == 0 and (M == 1 or bn <= 64):
                        out.append(dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=warps))
    return out


def measure(model: str, name: str, N: int, K: int, dev, args, gptq) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    zeros = torch.randint(0, 16, (K // G, N), generator=g, dtype=torch.uint8)
    scales = torch.rand(K // G, N, generator=g) * 0.002 + 0.003
    w_exact = awq_format.dequantize(codes, zeros, scales).to(dev)  # [N, K] fp32
    graphed = dev.type == "cuda"
    dtype = torch.bfloat16
    rows_out = []

    def record(kernel, M, fn, nbytes, x, extra=None):
        try:
            y = fn()
            ref = x.float() @ w_exact.t()
            err = ((y.float() - ref).norm() / ref.norm()).item()
            us = time_us(fn, 20 if M == 1 else 5, graphed)
            row = dict(model=model, shape=name, N=N, K=K, rows=M, kernel=kernel, us=round(us, 2),
                       gb_per_s=round(nbytes / us / 1e3, 1), rel_err=round(err, 5),
                       ok=err < TOL, **(extra or {}))
        except Exception as e:  # one candidate failing is a finding, not the end of the run
            row = dict(model=model, shape=name, N=N, K=K, rows=M, kernel=kernel,
                       error=f"{type(e).__name__}: {e}"[:300])
        rows_out.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    int4_bytes = N * K // 2 + (K // G) * N * 4  # codes + (scale, offset) pairs in bf16
    for M in ROWS if graphed else (1, 4, 40):
        x = torch.randn(M, K, generator=g).to(dev, dtype)
        record("bf16", M, partial(F.linear, x, w_exact.to(dtype)), 2 * N * K, x)
        for kernel in ("tinygemm", "triton", "cpu", "reference"):
            if not kernel_fits(kernel, dev, dtype, N, K, G):
                continue
            lin = Int4Linear.from_codes(codes, zeros, scales, None, dtype, dev, kernel)
            record(kernel, M, partial(lin, x), int4_bytes, x)
            if kernel == "triton" and M <= 16 and graphed:
                best = sweep_triton(lin, x, args.quick)
                if best:
                    record("triton-best", M, partial(triton_mm, x, lin, best), int4_bytes, x,
                           {"config": best})
            if kernel == "triton" and M > 16:  # its prefill path: dequantize, then cuBLAS
                record("triton-dequant+cublas", M, partial(dequant_mm, x, lin), int4_bytes, x)
            del lin
        if gptq is not None and graphed:
            failed = gptqmodel_row(gptq, codes, zeros, scales, x, record)
            if failed:
                rows_out.append(dict(model=model, shape=name, N=N, K=K, rows=M,
                                     kernel="gptqmodel-awq-triton", error=failed))
        if name == "lm_head":
            head = Int8Linear.quantize(w_exact, None, dtype, dev)
            record(f"int8-{head.kernel}", M, partial(head, x), N * K + 2 * N, x)
            del head
    return rows_out


def triton_mm(x, lin, cfg):
    from engine.kernels import int4_kernel

    return int4_kernel.int4_matmul(x, lin.packed, lin.scales_zeros, G, cfg)


def dequant_mm(x, lin):
    return F.linear(x, lin.dequantize())


def sweep_triton(lin, x, quick: bool) -> dict | None:
    """The fastest Triton tiles and split for this shape and row count, or None."""
    best = None
    for cfg in triton_configs(x.shape[0], lin.in_features, quick):
        try:
            us = time_us(partial(triton_mm, x, lin, cfg), 20, True)
        except Exception:  # a config Triton cannot build here: not a candidate
            continue
        if best is None or us < best[0]:
            best = (us, cfg)
    return best[1] if best else None


def gptqmodel_row(gptq, codes, zeros, scales, x, record) -> str | None:
    """gptqmodel's AWQ Triton GEMM on the checkpoint's own tensors, fp16, with the plan its
    scheduler picks -> None once recorded, else why it could not run."""
    gemm, sched = gptq
    (M, K), N = x.shape, codes.shape[0]
    packed = {k: v.to(x.device) for k, v in awq_format.pack(codes, zeros, scales).items()}
    try:
        plan = sched.select_awq_triton_plan(
            M=M, N=N, K=K, group_size=G, device=x.device, input_dtype=torch.float16,
            compute_dtype=torch.float16, output_dtype=torch.float16)  # its eager choice
    except Exception as e:
        return f"no plan: {type(e).__name__}: {e}"[:300]
    if not plan.fused:
        return "its plan for these rows dequantizes, then cuBLAS (not fused)"
    kw = plan.as_kwargs()
    record("gptqmodel-awq-triton", M, partial(
        gemm.awq_gemm_triton, x.half(), packed["qweight"], packed["scales"], packed["qzeros"],
        output_dtype=torch.float16, **kw), N * K // 2 + (K // G) * N * 2.5, x.half(),
        {"plan": {k: v for k, v in kw.items() if isinstance(v, int | float)}})
    return None


def table(rows: list[dict]) -> str:
    lines = ["| model | shape | rows | kernel | us | GB/s | rel. error |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['shape']} | {r['rows']} | {r['kernel']} | "
                         f"failed: {r['error'][:80]} | | |")
        else:
            lines.append(f"| {r['model']} | {r['shape']} | {r['rows']} | {r['kernel']} | "
                         f"{r['us']:.1f} | {r['gb_per_s']:,.0f} | {r['rel_err']:.1e} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="JSON lines, one per measurement")
    p.add_argument("--quick", action="store_true", help="a small Triton sweep")
    p.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU (a smoke test)")
    p.add_argument("--models", nargs="+", default=list(SHAPES))
    args = p.parse_args()
    dev = torch.device("cpu" if args.cpu or not torch.cuda.is_available() else "cuda")
    try:
        gptq = gptqmodel_triton() if dev.type == "cuda" else None
    except Exception as e:
        print(f"gptqmodel's AWQ Triton kernel is not importable: {e}", file=sys.stderr)
        gptq = None
    shapes = CPU_SHAPES if dev.type == "cpu" else {m: SHAPES[m] for m in args.models}
    rows = []
    for model, layers in shapes.items():
        for name, N, K in layers:
            rows += measure(model, name, N, K, dev, args, gptq)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            if args.out:  # rewritten after each layer: a run cut short keeps what it measured
                with open(args.out, "w") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
    print(table(rows))
    bad = [r for r in rows if r.get("ok") is False]
    if bad:
        print(f"\n{len(bad)} measurement(s) outside {TOL} relative error: "
              + ", ".join(f"{r['model']}/{r['shape']}/{r['kernel']}/{r['rows']}" for r in bad))
    return 0


if __name__ == "__main__":
    sys.exit(main())
