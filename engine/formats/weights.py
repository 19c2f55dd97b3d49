"""The weight formats (`--quant`), one entry each with the facts that hang on it.

No torch: the planner, request checks and the app read it. The bytes a quantized format takes are
the planner's arithmetic (plan/memory.py); "auto" is a choice word, never registered.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightFormat:
    name: str  # the --quant word
    bits: int  # per weight of a quantized linear layer (side tensors not counted)
    torch_dtype: str | None = None  # a float format's torch attribute; None: quantized
    safetensors_dtype: str | None = None  # a float format's name in safetensors headers
    library: str | None = None  # the package that runs it, checked before a load
    # parallel/sharded_step.py cuts it across GPUs (16-bit and fp32 weights so far)
    tensor_parallel: bool = False
    offered: bool = True  # listed in the app's pickers (fp32 is the CPU reference's format)
    # a mixture's experts in 4 bits (quant/experts4.py): the groups their input features are
    # cut in (the first that divides), and the 16-bit numbers each group keeps per output (a
    # scale, and an offset); () keeps the experts in 16 bits
    expert_groups: tuple[int, ...] = ()
    expert_group_numbers: int = 0

    @property
    def quantized(self) -> bool:
        return self.torch_dtype is None


_REGISTRY: dict[str, WeightFormat] = {}


def register(fmt: WeightFormat) -> WeightFormat:
    if fmt.name == "auto" or fmt.name in _REGISTRY:
        raise ValueError(f"weight format {fmt.name!r} is taken")
    _REGISTRY[fmt.name] = fmt
    return fmt


def unregister(name: str) -> None:
    del _REGISTRY[name]


def get(name: str) -> WeightFormat:
    """KeyError for a name never registered: callers check `names()` first for their message."""
    return _REGISTRY[name]


def names() -> tuple[str, ...]:
    """Every weight format, in registration order (the order error messages list them in)."""
    return tuple(_REGISTRY)


def quantized() -> tuple[str, ...]:
    return tuple(f.name for f in _REGISTRY.values() if f.quantized)


def expert_group(name: str, width: int) -> int | None:
    """The group a 4-bit expert's `width` input features are cut in under format `name`; None
    where its experts stay 16-bit or no group of the format divides the width."""
    return next((g for g in get(name).expert_groups if width % g == 0), None)


def floats() -> tuple[WeightFormat, ...]:
    """The plain float formats: a checkpoint's own dtype is one of these."""
    return tuple(f for f in _REGISTRY.values() if not f.quantized)


def offered() -> tuple[str, ...]:
    return tuple(f.name for f in _REGISTRY.values() if f.offered)


for _fmt in (WeightFormat("bf16", 16, "bfloat16", "BF16", tensor_parallel=True),
             WeightFormat("fp16", 16, "float16", "F16", tensor_parallel=True),
             WeightFormat("fp32", 32, "float32", "F32", tensor_parallel=True, offered=False),
             WeightFormat("int8", 8, library="bitsandbytes"),  # LLM.int8
             WeightFormat("nf4", 4, library="bitsandbytes", expert_groups=(64,),
                          expert_group_numbers=1),  # bitsandbytes' block: an absmax
             # the engine's own int4 layers (quant/int4_linear.py): a scale and an offset
             WeightFormat("awq", 4, expert_groups=(128, 64, 32), expert_group_numbers=2)):
    register(_fmt)
