"""Several GPUs in the model picker: the split to suggest (tensor parallelism over this machine's
GPUs, or over cards like this one when it is too small) and the fit per GPU when N of them share
the model. The app's door into engine.plan.multi_gpu (torch-free); fit_check.py is one card's.
What a split can run and the 16-bit dtype are the planner's rules, asked here, never restated.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.models import fit_check
from engine.plan import choices, multi_gpu
from engine.plan import memory as planner
from engine.plan.multi_gpu import MAX_DEVICES, allreduce_bytes, rank_shape, recommend_split
from engine.platform.gpu import GpuInfo, GpuReport

GiB = planner.GiB


@dataclass(frozen=True)
class SplitAdvice:
    num_devices: int
    text: str  # "needs 2 GPUs: tensor parallel 2, 17.5 GiB per GPU (...); this machine has 2"
    runs_here: bool  # this machine has that many GPUs: the picker can load it so


def fullest(report: GpuReport | None, n: int | None = None) -> GpuInfo | None:
    """Of the first n GPUs (all by default), the one with the least free memory: every rank
    holds the same share, so it decides whether the split fits."""
    gpus = report.gpus[:n] if report is not None and report.gpus else ()
    return min(gpus, key=lambda g: g.free_bytes) if gpus else None


def advice(shape: planner.ModelShape, report: GpuReport | None, kv_dtype: str = "auto",
           context: int | None = None) -> SplitAdvice | None:
    """The split where it beats one card (it fits where one card does not, or holds 16-bit
    weights, a 16-bit cache or a longer context): over this machine's GPUs when it has several,
    else over up to MAX_DEVICES cards like its one. None without a GPU or where one is best."""
    num = len(report.gpus) if report is not None else 0
    low = fullest(report)
    if low is None:
        return None
    context = min(context or shape.context_limit, shape.context_limit)
    split = recommend_split(shape, low.free_bytes, num if num >= 2 else MAX_DEVICES,
                            low.compute_capability, context, kv_dtype=kv_dtype)
    if split.num_devices == 1 or not split.fits:
        return None
    return SplitAdvice(split.num_devices, f"{split.summary()}; this machine has {num}",
                       num >= split.num_devices)


def fit_table(shape: planner.ModelShape, report: GpuReport | None, n: int, kv_dtype: str,
              context: int) -> fit_check.FitTable:
    """fit_check.fit_table for n GPUs: one row per weight format, bytes per GPU."""
    low = fullest(report, n)
    cc = low.compute_capability if low is not None else None
    w16 = choices.sixteen_bit(cc)
    context = min(context or shape.context_limit, shape.context_limit)
    formats = [shape.quant_method] if shape.quant_method else fit_check.formats()
    rows = tuple(fit_row(shape, report, n, q, kv_dtype, context) for q in formats)
    best = fit_row(shape, report, n, w16, kv_dtype, context)
    ctx = best.context if best.fits is not False else (best.max_context // 256 * 256 or context)
    return fit_check.FitTable(rows, w16, best.kv_dtype, ctx,
                              f"Tensor parallel {n}: each GPU holds 1/{n} of the layers' weights "
                              f"and KV heads, and the whole embedding.")


def fit_row(shape: planner.ModelShape, report: GpuReport | None, n: int, quant: str,
            kv_dtype: str, context: int) -> fit_check.FitRow:
    """One format on n GPUs, bytes per GPU; the formats the engine cannot cut do not fit."""
    low = fullest(report, n)
    cc = low.compute_capability if low is not None else None
    vram = low.free_bytes if low is not None else None
    kv = multi_gpu.tp_kv_dtype(quant, kv_dtype)
    extra = planner.CUDA_CONTEXT_BYTES + allreduce_bytes(n)  # NCCL's buffers ride with it
    p = planner.plan(rank_shape(shape, n), quant, kv, context, vram, compute_capability=cc,
                     cuda_context_bytes=extra)
    need = f"{quant} needs {p.total_bytes / GiB:.1f} GiB per GPU at {p.context:,} tokens"
    refusal = multi_gpu.tp_refusal(quant, kv)
    if refusal:
        reason, fits = f"{need}; {refusal}", False
    elif low is None:
        reason, fits = f"{need}; no GPU to check against", None
    else:
        have = f"the fullest of {n} GPUs has {low.free_bytes / GiB:.1f} GiB free"
        longest = f" (at most {p.max_context:,} tokens fit)" if not p.fits and p.max_context else ""
        reason, fits = f"{need}; {have}{longest}", p.fits
    return fit_check.FitRow(p.quant, p.kv_dtype, p.context, p.weights_bytes, p.kv_bytes,
                            p.total_bytes, fits, p.max_context, reason)
