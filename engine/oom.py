"""What to tell a user whose GPU ran out of memory: the planner's choice for this card.

Pure arithmetic over config.json (engine/plan.py), so the message names settings that fit rather
than a generic "use less memory". torch is imported only to release memory (`out_of_memory`).
"""

from __future__ import annotations

from engine.plan import CUDA_CONTEXT_BYTES, GiB, PlanError, recommend


class OutOfMemory(Exception):
    """A load or generation that ran out of GPU memory; its memory has been released."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


def hint(config: dict, quant: str, context: int, vram_bytes: int,
         compute_capability=None) -> str:
    """One line: the format and context the planner says fit `vram_bytes`, or the card needed."""
    from engine.model_shape import ModelShape

    try:
        shape = ModelShape.from_config(config)
        rec = recommend(shape, vram_bytes, compute_capability, context)
    except (PlanError, ValueError, KeyError, TypeError):
        return "try a 4-bit --quant nf4 or a shorter --context"
    if not rec.fits:
        return (f"this model needs a card of at least {rec.min_vram_bytes / GiB:.1f} GiB, "
                "or CPU offload")
    size = f"{rec.context // 1024}K" if rec.context % 1024 == 0 else f"{rec.context:,}"
    if rec.quant != quant:
        return f"try --quant {rec.quant} with a context of {size} tokens"
    return f"try a context of {size} tokens"


def out_of_memory(message: str, config: dict, quant: str, context: int,
                  vram_bytes: int | None) -> OutOfMemory:
    """Release what the failed allocation left cached, then say what would fit this card."""
    import gc

    import torch

    gc.collect()
    if not torch.cuda.is_available():
        return OutOfMemory(message, "try a 4-bit --quant nf4 or a shorter --context")
    torch.cuda.empty_cache()
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    # no limit given: the allocator's cap (a --memory-limit card) plus the context it excludes
    cap = int(props.total_memory * torch.cuda.get_per_process_memory_fraction(index))
    vram = vram_bytes or min(props.total_memory, cap + CUDA_CONTEXT_BYTES)
    return OutOfMemory(message, hint(config, quant, context, vram, (props.major, props.minor)))
