"""How a Session comes to be: its model and draft loaded from a LoadRequest (out of memory
answered with a plan that fits), and what it chooses for this card: the KV dtype for "auto" and
the largest prefill chunk. Not generation (session.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from engine.events import BadRequest, LoadProgress, LoadRequest
from engine.files.model_folder import check
from engine.formats.model_shape import ModelShape
from engine.load import loader
from engine.plan.kv_dtype import PLANNED_WEIGHTS, choose_kv_dtype
from engine.plan.memory import PREFILL_CHUNK, GiB, largest_prefill_chunk
from engine.plan.oom import memory_kind, out_of_memory
from engine.spec.proposers import check_same_tokenizer

NATIVE_KV = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def allocator_budget(device: torch.device) -> int:
    """What the allocator may take on this GPU (less with --memory-limit)."""
    total = torch.cuda.get_device_properties(device).total_memory
    return int(total * torch.cuda.get_per_process_memory_fraction(device.index or 0))


def kv_dtype_for(lm: loader.LoadedModel, requested: str) -> tuple[str, str]:
    """(KV dtype name, why): as asked, or for "auto" the model's own dtype unless the planner
    finds memory tight on this GPU (plan/kv_dtype.py)."""
    native = NATIVE_KV[lm.compute_dtype]
    if requested != "auto":
        return requested, "as asked"
    if lm.device.type != "cuda":
        return native, f"auto: the model's own {native} on the CPU"
    cc = torch.cuda.get_device_capability(lm.device)
    try:
        shape = ModelShape.from_config(lm.folder.config)
        return choose_kv_dtype(native, shape, lm.quant, lm.context, allocator_budget(lm.device),
                               cc)
    except Exception:  # the planner cannot read this config: the model's own dtype
        return native, f"auto: the model's own {native} (the planner cannot size this model)"


def prefill_chunk_for(lm: loader.LoadedModel, kv_dtype: str) -> int:
    """The planner's choice on a GPU (the allocator's budget); the smallest pass on CPU."""
    if lm.device.type != "cuda":
        return PREFILL_CHUNK
    quant = lm.quant if lm.quant in PLANNED_WEIGHTS else "bf16"
    try:
        shape = ModelShape.from_config(lm.folder.config)
        return largest_prefill_chunk(shape, quant, kv_dtype, lm.context,
                                     allocator_budget(lm.device))
    except Exception:  # the planner cannot read this config: stay with the safe size
        return PREFILL_CHUNK


def load_session(cls, req: LoadRequest, progress: Callable[[LoadProgress], None],
                 cancel: threading.Event | None):
    """cls(...) over the loaded model, its draft attached. Raises oom.OutOfMemory (memory
    released, a hint that fits) when the card is full."""
    try:
        return _load(cls, req, progress, cancel)
    except Exception as e:  # torch.OutOfMemoryError, or the CPU allocator's RuntimeError
        kind = memory_kind(e)
        if kind is None:
            raise
    # answered out of the except block: its traceback holds the half-loaded model
    config = check(req.model).config
    vram = int(req.memory_limit_gib * GiB) if req.memory_limit_gib else None
    where = "this GPU's memory" if kind == "GPU" else "this computer's memory (RAM)"
    raise out_of_memory(f"the model does not fit in {where}", config, req.quant,
                        req.context or config.get("max_position_embeddings") or 4096, vram,
                        on_cpu=kind == "CPU")


def _load(cls, req: LoadRequest, progress: Callable[[LoadProgress], None],
          cancel: threading.Event | None):
    req.validate()
    folder = check(req.model)
    tok = draft_tok = None
    if req.draft is not None:  # a wrong draft fails before any weights load
        from transformers import AutoTokenizer

        tok, draft_tok = (AutoTokenizer.from_pretrained(f.path, trust_remote_code=False)
                          for f in (folder, check(req.draft)))
        check_same_tokenizer(tok, draft_tok, req.draft)
    lm = loader.load(folder, req, progress, cancel, tokenizer=tok)
    session = cls(lm, req.kv_dtype, fast_path=not req.eager, compile_layers=req.compile)
    session.num_speculative_tokens = req.num_speculative_tokens
    if req.draft is not None:
        session.attach_draft(_load_draft(cls, req, lm, progress, cancel, draft_tok))
    return session


def _load_draft(cls, req: LoadRequest, lm: loader.LoadedModel,
                progress: Callable[[LoadProgress], None], cancel, tokenizer):
    folder = check(req.draft)
    dreq = LoadRequest(model=req.draft, device=lm.device.type, context=lm.context,
                       eager=req.eager, compile=req.compile)
    tagged = lambda e: progress(LoadProgress(f"draft {e.stage}", e.done, e.total,
                                             e.message and f"draft: {e.message}"))
    try:
        dlm = loader.load(folder, dreq, tagged, cancel, tokenizer=tokenizer)
    except BadRequest as e:
        raise BadRequest(f"draft model: {e}") from None
    return cls(dlm, "auto", fast_path=not req.eager, compile_layers=req.compile)
