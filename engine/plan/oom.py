"""What to tell a user whose GPU (or computer) ran out of memory: the planner's choice for it.

Pure arithmetic over config.json (engine/plan/memory.py), so the message names settings that fit
rather
than a generic "use less memory". torch is imported only to release memory (`out_of_memory`).
"""

from __future__ import annotations

from engine.plan.memory import CUDA_CONTEXT_BYTES, GiB, PlanError, recommend
from engine.plan.ram import available_ram_bytes

# the CPU allocator's failure is a plain RuntimeError ("[enforce fail at alloc_cpu.cpp] ...
# DefaultCPUAllocator: can't allocate memory"), not torch.OutOfMemoryError
_CPU_ALLOCATOR = ("DefaultCPUAllocator", "can't allocate memory", "not enough memory")


class OutOfMemory(Exception):
    """A load or generation that ran out of memory; its memory has been released."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


def memory_kind(exc: BaseException) -> str | None:
    """"GPU" or "CPU" when `exc` is an allocator out of memory, None for any other error."""
    if isinstance(exc, MemoryError):
        return "CPU"
    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    if any(p in text for p in _CPU_ALLOCATOR):
        return "CPU"
    if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in text:
        return "GPU"
    return None


def hint(config: dict, quant: str, context: int, vram_bytes: int,
         compute_capability=None, on_cpu: bool = False) -> str:
    """One line: the format and context the planner says fit `vram_bytes` (of the card, or of
    free RAM `on_cpu`), or the memory needed."""
    from engine.formats.model_shape import ModelShape

    try:
        shape = ModelShape.from_config(config)
        rec = recommend(shape, vram_bytes, compute_capability, context,
                        cuda_context_bytes=0 if on_cpu else CUDA_CONTEXT_BYTES)
    except (PlanError, ValueError, KeyError, TypeError):
        return "try a 4-bit --quant nf4 or a shorter --context"
    if not rec.fits:
        if on_cpu:
            return (f"this model needs at least {rec.min_vram_bytes / GiB:.1f} GiB of free "
                    "memory; close other programs or use a smaller model")
        return (f"this model needs a card of at least {rec.min_vram_bytes / GiB:.1f} GiB, "
                "or CPU offload")
    size = f"{rec.context // 1024}K" if rec.context % 1024 == 0 else f"{rec.context:,}"
    if rec.quant != quant:
        return f"try --quant {rec.quant} with a context of {size} tokens"
    return f"try a context of {size} tokens"


def out_of_memory(message: str, config: dict, quant: str, context: int,
                  vram_bytes: int | None, on_cpu: bool = False) -> OutOfMemory:
    """Release what the failed allocation left cached, then say what would fit this card (or,
    `on_cpu`, the computer's free memory)."""
    import gc

    import torch

    gc.collect()
    if on_cpu:
        ram = available_ram_bytes()
        return OutOfMemory(message, hint(config, quant, context, ram, on_cpu=True) if ram else
                           "try a 4-bit --quant nf4 or a shorter --context")
    if not torch.cuda.is_available():
        return OutOfMemory(message, "try a 4-bit --quant nf4 or a shorter --context")
    torch.cuda.empty_cache()
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    # no limit given: the allocator's cap (a --memory-limit card) plus the context it excludes
    cap = int(props.total_memory * torch.cuda.get_per_process_memory_fraction(index))
    vram = vram_bytes or min(props.total_memory, cap + CUDA_CONTEXT_BYTES)
    return OutOfMemory(message, hint(config, quant, context, vram, (props.major, props.minor)))
