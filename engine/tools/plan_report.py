"""`hearth plan` and `hearth gpu`: print the planner's and NVML's answers (no torch here).

Exit codes follow the command-line contract: 0 ok, 2 bad input (missing or malformed model folder,
impossible settings, or a model that cannot fit: then the plan is still printed). Bad input is one
line on stderr, never a traceback. With as_json, stdout holds exactly one JSON object.
"""

from __future__ import annotations

import json
import math
import sys

from engine.files.model_folder import resolve
from engine.formats import kv_dtypes, weights
from engine.plan import memory as planner
from engine.plan.ram import available_ram_bytes
from engine.platform.gpu import GpuReport, detect_gpus
from engine.tools import plan_multi_report

GiB = planner.GiB
MAX_VRAM_GIB = 1 << 20  # a pebibyte: past any card, and int(GiB * 1e308) would overflow
_ROWS = (("weights", "weights_bytes"), ("KV cache", "kv_bytes"),
         ("activations", "activation_bytes"), ("CUDA context", "cuda_context_bytes"),
         ("CUDA graph pool", "graph_pool_bytes"), ("draft model", "draft_bytes"),
         ("safety margin", "margin_bytes"))


def _fail(command: str, message: str) -> int:
    print(f"hearth {command}: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def _shape(model: str | None) -> tuple[str, planner.ModelShape]:
    path = resolve(model)
    if path.is_file() and path.suffix == ".gguf":
        raise planner.PlanError(f"{path.name} is a GGUF file; Hearth reads Hugging Face "
                                "safetensors checkpoints")
    return str(path), planner.ModelShape.from_folder(path)


def _refused(shape: planner.ModelShape) -> str:
    return f"{shape.refusal}, so it does not load whatever the card"


def _card(vram_gib: float | None,
          gpu: str | None) -> tuple[int | None, dict | None, str, str]:
    """(memory to plan for, the card as a dict, a label, the device). --vram wins over --gpu;
    without a GPU the plan is the CPU's, against the computer's free memory."""
    if vram_gib is not None:
        if not (isinstance(vram_gib, int | float) and math.isfinite(vram_gib)
                and 0 < vram_gib <= MAX_VRAM_GIB):
            raise planner.PlanError(f"--vram must be a positive number of GiB up to "
                                    f"{MAX_VRAM_GIB:,}, not {vram_gib!r}")
        return int(vram_gib * GiB), None, f"{vram_gib:g} GiB (--vram)", "cuda"
    report = detect_gpus()
    if not report.gpus:  # where the engine runs then: the CPU, in the computer's memory
        ram = available_ram_bytes() or None
        free = f"{ram / GiB:.2f} GiB of memory free" if ram else "its free memory unknown"
        return ram, None, f"the CPU, {free} (no GPU: {report.reason})", "cpu"
    if gpu is None:
        return None, None, "none given (pass --vram GIB or --gpu auto to check a fit)", "cuda"
    if gpu == "auto":
        index = 0  # the engine loads on the first GPU
    elif str(gpu).isdigit():
        index = int(gpu)
    else:
        raise planner.PlanError(f"--gpu takes auto or a GPU index, not {gpu!r}")
    found = [g for g in report.gpus if g.index == index]
    if not found:
        raise planner.PlanError(f"there is no GPU {index}; `hearth gpu` lists them")
    g = found[0]
    # what is free now: a desktop's display server and other programs already hold the rest
    label = (f"GPU {g.index} {g.name}: {g.free_bytes / GiB:.2f} GiB free of "
             f"{g.total_bytes / GiB:.2f} GiB")
    return g.free_bytes, g.to_dict(), label, "cuda"


def run_plan(model: str | None, vram_gib: float | None = None, gpu: str | None = None,
             context: int | None = None, quant: str | None = "auto",
             kv_dtype: str | None = "auto", draft: str | None = None, as_json: bool = False,
             concurrency: int = 1, tensor_parallel: int = 1) -> int:
    """Print the memory plan for `model`; 0 when it fits (or no card was given), else 2. With
    tensor_parallel N > 1, the plan per card of N (tools/plan_multi_report.py)."""
    quant, kv_dtype = quant or "auto", kv_dtype or "auto"
    try:
        if quant not in ("auto", *weights.names()):
            raise planner.PlanError(f"--quant must be auto or one of "
                                    f"{', '.join(weights.names())}, not {quant!r}")
        if kv_dtype not in ("auto", *kv_dtypes.names()):
            raise planner.PlanError(f"--kv-dtype must be auto or one of "
                                    f"{', '.join(kv_dtypes.names())}, not {kv_dtype!r}")
        if context is not None and (not isinstance(context, int) or context < 1):
            raise planner.PlanError(f"--context must be a positive number of tokens, not "
                                    f"{context!r}")
        if not isinstance(tensor_parallel, int) or tensor_parallel < 1:
            raise planner.PlanError(f"--tensor-parallel takes a whole number of GPUs, 1 or more, "
                                    f"got {tensor_parallel!r}")
        path, shape = _shape(model)
        if tensor_parallel > 1:
            if draft:
                raise planner.PlanError("a draft model does not run beside --tensor-parallel yet")
            code = plan_multi_report.run(path, shape, tensor_parallel, vram_gib, gpu, context,
                                         quant, kv_dtype, as_json)
            return _fail("plan", _refused(shape)) if shape.refusal else code
        draft_shape = _shape(draft)[1] if draft else None
        vram, card, label, device = _card(vram_gib, gpu)
        cc = tuple(card["compute_capability"]) if card else None
        p = planner.plan(shape, quant, kv_dtype, context, vram, draft_shape,
                         compute_capability=cc, concurrency=concurrency, device=device)
        split = None if draft or device == "cpu" else plan_multi_report.advise(
            shape, vram, gpu, context, quant, kv_dtype)
    except ValueError as e:  # PlanError and model_folder's BadModel: the user's to fix
        return _fail("plan", str(e))
    except OverflowError:  # a size past float range (a --context of 10**400, say)
        return _fail("plan", "the sizes given are too large to plan for")
    if as_json:
        out = {"model": path, "model_type": shape.model_type, "param_source": shape.param_source,
               "native_context": shape.max_position_embeddings,
               "sliding_window": shape.sliding_window, "card": card, "device": device,
               **p.to_dict(),
               "split": split.to_dict() if split else None}
        print(json.dumps(out))
    else:
        _print_plan(path, shape, p, label, device)
        if split:
            plan_multi_report.print_advice(split, plan_multi_report.machine_gpus(gpu)[0])
    if shape.refusal:  # sized above all the same, but it does not load
        return _fail("plan", _refused(shape))
    if p.fits is False:
        r = p.recommended
        hint = (f"{r['quant']} weights, a {r['kv_dtype']} KV cache and a context of "
                f"{r['context']:,} do fit" if r.get("fits") else r.get("note") or "")
        return _fail("plan", f"the model does not fit in {p.vram_bytes / GiB:.2f} GiB with these "
                             f"settings; {hint}")
    return 0


def _kv_arithmetic(shape: planner.ModelShape, p: planner.Plan) -> str:
    """Bytes a token of context; where sliding layers keep rings, theirs apart (a sequence's)."""
    if not shape.local_layers:
        return f"{p.kv_bytes_per_token:,} bytes/token"
    layer = p.kv_bytes_per_token // shape.num_layers
    full, ring = shape.num_layers - shape.local_layers, planner.ring_tokens(
        shape, p.context, p.prefill_chunk)
    return (f"{layer * full:,} bytes/token in {full} global layers x {p.context:,} + "
            f"{layer * shape.local_layers:,} in {shape.local_layers} sliding layers x {ring:,}, "
            f"x {p.concurrency}")


def _print_plan(path: str, shape: planner.ModelShape, p: planner.Plan, label: str,
                device: str) -> None:
    window = f", sliding window {shape.sliding_window:,}" if shape.sliding_window else ""
    print(f"Model     {path}")
    print(f"          {shape.model_type}, {p.params / 1e9:.3f} B parameters (from "
          f"{shape.param_source}), native context {shape.max_position_embeddings:,}{window}")
    print(f"{'Card' if device == 'cuda' else 'Runs on':<10}{label}")
    print(f"Settings  {p.quant} weights, {p.kv_dtype} KV cache, context {p.context:,} tokens x "
          f"{p.concurrency}, prefill chunk {p.prefill_chunk}")
    print()
    for name, key in _ROWS:
        if device == "cpu" and key in ("cuda_context_bytes", "graph_pool_bytes"):
            continue  # nothing of CUDA's on the CPU
        extra = f"  ({_kv_arithmetic(shape, p)})" if key == "kv_bytes" else ""
        print(f"  {name:<16}{getattr(p, key) / GiB:>9.2f} GiB{extra}")
    verdict = {None: "", True: "  fits", False: "  DOES NOT FIT"}[p.fits]
    of = f" of {p.vram_bytes / GiB:.2f}" if p.vram_bytes is not None else ""
    print(f"  {'total':<16}{p.total_bytes / GiB:>9.2f} GiB{of}{verdict}")
    print()
    if shape.refusal is None:  # what would fit of a model that does not load is no answer
        print(f"Longest context that fits: {p.max_context:,} tokens")
    if p.max_concurrency is not None and shape.refusal is None:
        print(f"Sequences of {p.context:,} tokens that fit at once: {p.max_concurrency}")
    r = p.recommended
    if r:
        print(f"Recommended: {r['quant']} weights, {r['kv_dtype']} KV cache, context "
              f"{r['context']:,} on {r['device']}")
        if r.get("note"):
            print(f"  {r['note']}")
    for note in p.notes:
        print(f"Note: {note}")


def run_gpu(as_json: bool = False) -> int:
    """List the NVIDIA GPUs; no GPU or no driver is a normal answer (exit 0)."""
    report: GpuReport = detect_gpus()
    if as_json:
        print(json.dumps(report.to_dict()))
        return 0
    if not report.gpus:
        print(f"No NVIDIA GPU: {report.reason}.")
        return 0
    for g in report.gpus:
        print(f"GPU {g.index}  {g.name}")
        print(f"  memory   {g.total_bytes / GiB:.2f} GiB total, {g.free_bytes / GiB:.2f} GiB free, "
              f"{g.used_bytes / GiB:.2f} GiB used")
        print(f"  compute  {g.compute_capability[0]}.{g.compute_capability[1]}  bf16 "
              f"{'yes' if g.supports_bf16 else 'no'}  fp8 {'yes' if g.supports_fp8 else 'no'}")
        print(f"  driver   {g.driver_version}   uuid {g.uuid}")
    if report.reason:
        print(f"Note: {report.reason}")
    return 0
