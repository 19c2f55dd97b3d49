"""Will this model fit this card, or without a GPU the computer's memory? The app's one door
into engine.plan.memory, engine.plan.ram and engine.platform.gpu (all torch-free): a model's
summary, one fit row per weight format, and the card (or memory) to plan for."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.formats import kv_dtypes, weights
from engine.plan import memory as planner
from engine.plan.ram import available_ram_bytes
from engine.platform import gpu as engine_gpu
from engine.platform.gpu import GpuInfo, GpuReport

GiB = planner.GiB


# read from engine/formats at each call, not at import: a format registered later is offered too
def formats() -> tuple[str, ...]:
    """The rows of the fit table: every weight format the app offers (fp32 is for the CPU)."""
    return weights.offered()


def quant_choices() -> tuple[str, ...]:
    return ("auto", *formats())


def kv_choices() -> tuple[str, ...]:
    return ("auto", *kv_dtypes.offered())


@dataclass(frozen=True)
class ModelSummary:
    architecture: str
    num_params: int
    native_context: int
    native_dtype: str
    checkpoint_format: str | None  # "awq", "nf4", "int8" for a pre-quantized checkpoint


@dataclass(frozen=True)
class FitRow:
    quant: str
    kv_dtype: str
    context: int
    weights_bytes: int
    kv_bytes: int
    total_bytes: int
    fits: bool | None  # None: nothing to check against (the GPUs not yet looked for)
    max_context: int
    reason: str  # one sentence, e.g. "bf16 needs 15.2 GiB; this card has 11.6 GiB free"


def cpu_memory(report: GpuReport | None) -> int | None:
    """The computer's free memory where the engine runs on the CPU (a report without a GPU);
    None with a GPU, or while the GPUs are still being looked for."""
    if report is None or report.gpus:
        return None
    return available_ram_bytes() or None


@dataclass(frozen=True)
class FitTable:
    rows: tuple[FitRow, ...]
    recommended_quant: str
    recommended_kv_dtype: str
    recommended_context: int
    note: str  # the planner's reason or warning, may be empty


def detect_gpus() -> GpuReport:
    """NVML's view of the cards; may take a moment: call it off the GUI thread."""
    return engine_gpu.detect_gpus()


def process_used_bytes(pid: int, index: int = 0) -> int | None:
    """VRAM NVML charges to the worker process, or None where that cannot be known."""
    return engine_gpu.process_used_bytes(pid, index)


def first_gpu(report: GpuReport | None) -> GpuInfo | None:
    """The card the engine loads on."""
    return report.gpus[0] if report is not None and report.gpus else None


def model_shape(folder: Path) -> planner.ModelShape:
    """Raises planner.PlanError with one sentence when the folder cannot be read."""
    return planner.ModelShape.from_folder(folder)


def shape_from_config(config: dict) -> planner.ModelShape:
    """A Hub repo's shape from its config.json alone, before its weights are downloaded."""
    return planner.ModelShape.from_config(config)


def summarize(shape: planner.ModelShape) -> ModelSummary:
    return ModelSummary(shape.model_type, shape.total_params, shape.context_limit,
                        shape.native_dtype, shape.quant_method)


def fit_table(shape: planner.ModelShape, gpu: GpuInfo | None, kv_dtype: str = "auto",
              context: int | None = None, draft: planner.ModelShape | None = None,
              ram_bytes: int | None = None) -> FitTable:
    """One row per weight format at this KV dtype and context, against the card's free VRAM
    (without a card: the computer's free memory, `ram_bytes`, on the CPU); with a draft model,
    its weights and cache count too."""
    cc = gpu.compute_capability if gpu is not None else None
    context = min(context or shape.context_limit, shape.context_limit)
    memory, device = _memory(gpu, ram_bytes)
    best = planner.recommend(shape, memory, cc, context, kv_dtype=kv_dtype, draft=draft,
                             device=device)
    # a quantized checkpoint is loaded in its own format only
    quants = [shape.quant_method] if shape.quant_method else formats()
    rows = tuple(fit_row(shape, gpu, quant, kv_dtype, context, draft, ram_bytes)
                 for quant in quants)
    return FitTable(rows, best.quant, best.kv_dtype, best.context, best.note or "")


def fit_row(shape: planner.ModelShape, gpu: GpuInfo | None, quant: str, kv_dtype: str,
            context: int, draft: planner.ModelShape | None = None,
            ram_bytes: int | None = None) -> FitRow:
    cc = gpu.compute_capability if gpu is not None else None
    memory, device = _memory(gpu, ram_bytes)
    p = planner.plan(shape, quant, kv_dtype, context, memory, draft, compute_capability=cc,
                     device=device)
    reason = _reason(p, gpu)
    if p.quant == "awq" and shape.quant_method != "awq":
        reason += "; needs an AWQ copy first (hearth quantize --method awq)"
    return FitRow(p.quant, p.kv_dtype, p.context, p.weights_bytes, p.kv_bytes, p.total_bytes,
                  p.fits, p.max_context, reason)


def can_draft_for(draft: planner.ModelShape, target: planner.ModelShape) -> bool:
    """Worth offering as a draft: the same vocabulary size and fewer parameters (the engine
    compares the two tokenizers token by token when it loads them)."""
    return draft.vocab_size == target.vocab_size and draft.total_params < target.total_params


def _memory(gpu: GpuInfo | None, ram_bytes: int | None) -> tuple[int | None, str]:
    """(bytes to fit in, device): what is free now (a desktop's display server and other
    programs hold the rest) of the card, else of the computer's memory on the CPU."""
    return (gpu.free_bytes, "cuda") if gpu is not None else (ram_bytes, "cpu")


def _reason(p: planner.Plan, gpu: GpuInfo | None) -> str:
    need = f"{p.quant} needs {p.total_bytes / GiB:.1f} GiB at {p.context:,} tokens"
    if p.draft_bytes:
        need += f" (the draft model's {p.draft_bytes / GiB:.2f} GiB included)"
    if gpu is None and p.vram_bytes is None:
        return f"{need}; no GPU to check against (CPU mode)"
    have = (f"this card has {gpu.free_bytes / GiB:.1f} GiB free" if gpu is not None else
            f"no GPU: on the CPU, this computer has {p.vram_bytes / GiB:.1f} GiB of memory free")
    if p.fits:
        return f"{need}; {have}"
    longest = f" (at most {p.max_context:,} tokens fit)" if p.max_context else ""
    return f"{need}; {have}{longest}"
