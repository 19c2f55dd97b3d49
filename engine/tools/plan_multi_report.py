"""`hearth plan` over several cards (plan/multi_gpu.py's answers; no torch): the plan per GPU for
`--tensor-parallel N`, and the split suggested beside a one-card plan when this machine has several
GPUs or one card is too small. tools/plan_report.py prints the one-card plan.
"""

from __future__ import annotations

import json
import math
import sys

from engine.formats import kv_dtypes
from engine.formats.model_shape import ModelShape, PlanError
from engine.plan import memory as planner
from engine.plan.multi_gpu import (
    MAX_DEVICES,
    MultiPlan,
    Split,
    plan_multi,
    recommend_split,
    split_error,
    valid_splits,
)
from engine.platform.gpu import detect_gpus

GiB = planner.GiB
_ROWS = (("weights", "weights_bytes_per_device"), ("KV cache", "kv_bytes_per_device"),
         ("activations", "activation_bytes"), ("CUDA context", "cuda_context_bytes"),
         ("NCCL buffers", "allreduce_bytes"), ("CUDA graph pool", "graph_pool_bytes"),
         ("safety margin", "margin_bytes"))


def machine_gpus(gpu: str | None) -> tuple[int, int | None, tuple[int, int] | None]:
    """(GPUs, free bytes of the fullest one, its compute capability) for --gpu auto; (0, None,
    None) without it. Every rank holds the same share, so the fullest card decides."""
    if gpu is None:
        return 0, None, None
    gpus = detect_gpus().gpus
    if not gpus:
        return 0, None, None
    low = min(gpus, key=lambda g: g.free_bytes)
    return len(gpus), low.free_bytes, tuple(low.compute_capability)


def advise(shape: ModelShape, vram: int | None, gpu: str | None, context: int | None,
           quant: str, kv_dtype: str) -> Split | None:
    """The split to show beside a one-card plan, where it beats one card (fits where one card
    does not, or holds 16-bit weights, a 16-bit cache or a longer context): over this machine's
    GPUs when it has several, else over up to MAX_DEVICES cards like the one planned for."""
    num, free, cc = machine_gpus(gpu)
    if num >= 2:
        split = recommend_split(shape, free, num, cc, context, quant=quant, kv_dtype=kv_dtype)
    elif vram is not None:
        split = recommend_split(shape, vram, MAX_DEVICES, cc, context, quant=quant,
                                kv_dtype=kv_dtype)
    else:
        return None
    return split if split.num_devices > 1 and split.fits else None


def print_advice(split: Split, num_here: int) -> None:
    n = split.num_devices
    card = split.plan.vram_bytes_per_device / GiB
    here = f"this machine has {num_here}" if num_here else f"cards of {card:.2f} GiB, as planned"
    print(f"Split     {split.summary()}; {here}")
    print(f"          `hearth run --tensor-parallel {n}` runs it; `hearth plan --tensor-parallel "
          f"{n}` shows the bytes per GPU")


def run(path: str, shape: ModelShape, n: int, vram_gib: float | None, gpu: str | None,
        context: int | None, quant: str, kv_dtype: str, as_json: bool) -> int:
    """`hearth plan --tensor-parallel N`: bytes on each of N cards; 0 when they fit (or no card
    was given), else 2. Byte counts in --json are per GPU, as --vram is."""
    err = split_error(shape, n)
    if err:
        ways = ", ".join(str(k) for k in valid_splits(shape) if k > 1)
        raise PlanError(err + (f"; --tensor-parallel takes {ways}" if ways else ""))
    if quant in ("int8", "nf4", "awq"):
        raise PlanError(f"tensor parallelism cuts 16-bit weights only so far, not {quant}")
    if kv_dtype in kv_dtypes.quantized():
        raise PlanError(f"tensor parallelism keeps a 16-bit KV cache so far, not {kv_dtype}")
    if vram_gib is not None:
        if not (isinstance(vram_gib, int | float) and math.isfinite(vram_gib) and vram_gib > 0):
            raise PlanError(f"--vram must be a positive number of GiB, not {vram_gib!r}")
        vram, cc, label = int(vram_gib * GiB), None, f"{n} x {vram_gib:g} GiB (--vram)"
    elif gpu is not None:
        num, vram, cc = machine_gpus(gpu)
        if num < n:
            raise PlanError(f"--tensor-parallel {n} needs {n} GPUs and this machine has {num}")
        label = f"{n} of this machine's {num} GPUs, the fullest with {vram / GiB:.2f} GiB free"
    else:
        vram, cc, label = None, None, "none given (pass --vram GIB or --gpu auto to check a fit)"
    w16 = "fp16" if cc and cc < (8, 0) else "bf16"
    q = w16 if quant == "auto" else quant
    kv = q if kv_dtype == "auto" else kv_dtype  # auto: 16-bit, as the ranks cache it
    mp = plan_multi(shape, n, q, kv, context, vram)
    best = recommend_split(shape, vram, n, cc, context) if vram is not None else None
    if as_json:
        print(json.dumps({
            "model": path, "model_type": shape.model_type, "param_source": shape.param_source,
            "native_context": shape.max_position_embeddings, "tensor_parallel": n,
            **mp.to_dict(), "weights_bytes": mp.weights_bytes_per_device,
            "kv_bytes_per_token": mp.kv_bytes_per_token_per_device,
            "kv_bytes": mp.kv_bytes_per_device, "total_bytes": mp.total_bytes_per_device,
            "total_bytes_all_devices": mp.total_bytes,
            "recommended": best.to_dict() if best else None}))
    else:
        _print(path, shape, mp, label, best)
    if mp.fits is False:
        most = (f"at most {mp.max_context:,} tokens do" if mp.max_context else
                "not even the weights do")
        print(f"hearth plan: the model does not fit {n} cards of {vram / GiB:.2f} GiB with these "
              f"settings; {most}", file=sys.stderr)
        return 2
    return 0


def _print(path: str, shape: ModelShape, mp: MultiPlan, label: str, best: Split | None) -> None:
    n = mp.num_devices
    print(f"Model     {path}")
    print(f"          {shape.model_type}, {shape.total_params / 1e9:.3f} B parameters, native "
          f"context {shape.max_position_embeddings:,}")
    print(f"Cards     {label}")
    print(f"Settings  {mp.quant} weights, {mp.kv_dtype} KV cache, context {mp.context:,} tokens, "
          f"tensor parallel {n}")
    print()
    print("Per GPU (each holds 1/N of the heads and MLP columns, the whole embedding and norms)")
    for name, key in _ROWS:
        extra = (f"  ({mp.kv_bytes_per_token_per_device:,} bytes/token)"
                 if key == "kv_bytes_per_device" else "")
        print(f"  {name:<16}{getattr(mp, key) / GiB:>9.2f} GiB{extra}")
    verdict = {None: "", True: "  fits", False: "  DOES NOT FIT"}[mp.fits]
    of = f" of {mp.vram_bytes_per_device / GiB:.2f}" if mp.vram_bytes_per_device else ""
    print(f"  {'total':<16}{mp.total_bytes_per_device / GiB:>9.2f} GiB{of}{verdict}")
    print()
    print(f"Longest context that fits: {mp.max_context:,} tokens")
    print(f"Host memory while loading: {mp.host_bytes / GiB:.2f} GiB (rank 0 reads the whole "
          f"model before it cuts it)")
    if best is not None:
        print(f"Recommended over up to {n} GPUs: {best.summary()}")
