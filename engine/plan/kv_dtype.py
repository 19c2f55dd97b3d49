"""`--kv-dtype auto`: the model's own 16-bit dtype while memory is plentiful; where the planner
finds it tight on this card, fp8 from compute capability 8.9 on (Ada, Hopper: hardware e4m3
conversion) and int8 below. Pure arithmetic over the planner (plan/memory.py): no torch here.
"""

from __future__ import annotations

from engine.formats import kv_dtypes, weights
from engine.formats.model_shape import ModelShape
from engine.plan.memory import recommend

PLANNED_WEIGHTS = weights.names()  # what the planner can size: every format plan/sizes.py counts


def auto_kv_dtype(native: str, planned: str, compute_capability) -> str:
    """native: the model's compute dtype ("bf16", "fp16", "fp32"); planned: the planner's KV
    dtype for this load (a quantized one means a 16-bit cache did not fit)."""
    if planned not in kv_dtypes.quantized():
        return native
    return kv_dtypes.eight_bit_for(compute_capability)


def choose_kv_dtype(native: str, shape: ModelShape, quant: str, context: int, vram_bytes: int,
           compute_capability) -> tuple[str, str]:
    """-> (KV dtype, why) for a model already loaded in `quant` on a card of `vram_bytes`."""
    quant = quant if quant in PLANNED_WEIGHTS else "bf16"
    rec = recommend(shape, vram_bytes, compute_capability, context, quant=quant)
    chosen = auto_kv_dtype(native, rec.kv_dtype, compute_capability)
    if chosen == native:
        return chosen, f"auto: the model's own {native}, a 16-bit cache fits"
    return chosen, (f"auto: memory is tight for a 16-bit cache at {context:,} tokens on this "
                    f"card, so {chosen} (compute capability "
                    f"{'.'.join(map(str, compute_capability))})")
