"""The weight formats (`--quant`), one entry each with the facts that hang on it: its loader
(load/weight_loaders.py), a linear layer's bytes in it (the planner's, plan/sizes.py), and what
callers would otherwise ask of its name. No torch: the planner, request checks and the app read
it, and a loader is named, not imported. "auto" is a choice word, never registered."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

AWQ_GROUP = 128  # input features an AWQ checkpoint's scale and zero cover, unless it says
NF4_BLOCK, NF4_DQ_BLOCK = 64, 256
NF4_DOUBLE_QUANT = True  # load/weight_loaders.py loads NF4 with bnb_4bit_use_double_quant=True


def _nf4_bytes(out: int, inp: int, group: int | None, double_quant: bool | None) -> int:
    """Packed 4-bit + absmax per 64 weights + the 16-entry fp32 code. Double quant: uint8 absmax
    + fp32 absmax per 256 blocks + 256-entry code + offset; on a GPU the engine's own layer keeps
    a bf16 absmax instead (quant/nf4_linear.py), so never fewer than 2 bytes a block."""
    n, dq = out * inp, NF4_DOUBLE_QUANT if double_quant is None else double_quant
    blocks = -(-n // NF4_BLOCK)
    absmax = (blocks + 4 * -(-blocks // NF4_DQ_BLOCK) + 4 * 256 + 4) if dq else 4 * blocks
    return -(-n // 2) + max(absmax, 2 * blocks) + 64


def _awq_bytes(out: int, inp: int, group: int | None, double_quant: bool | None) -> int:
    """What the engine's int4 layer holds (quant/int4_linear.py): 4-bit codes, and a 16-bit
    scale and offset per group and output (an AWQ checkpoint's 4-bit zeros and fp16 scales take
    2.5 bytes there: the card holds 4)."""
    groups = -(-inp // (group or AWQ_GROUP))
    return inp * 4 * -(-out // 8) + groups * out * 4


def _dequantized_matrix(linears, tokens: int) -> int:
    """A prefill matmul dequantizes one weight matrix to 16 bits (bitsandbytes NF4, AWQ's torch
    backend)."""
    return 2 * max((o * i for o, i, _ in linears), default=0)


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
    # "module:attribute" of its loader, resolved by load/weight_loaders.py (no torch here)
    loader: str = "engine.load.weight_loaders:FLOATS"
    # a quantized linear's bytes, side tensors included: (out, in, the checkpoint's group or
    # None, its double quantization or None); a float format's are bits / 8 a weight
    linear_bytes: Callable[[int, int, int | None, bool | None], int] | None = None
    # transient bytes a prefill pass of `tokens` adds for the linears (out, in, count)
    prefill_scratch: Callable[[tuple, int], int] = lambda linears, tokens: 0
    quality: int = 0  # the planner's preference among formats that fit: 0 best (16 bits)
    fallback: bool = False  # the planner's own choice where 16 bits do not fit (not opted into)
    # a load rounds a 16-bit checkpoint to it (else only a mixture's, or random weights)
    rounds_at_load: bool = True
    slow_on_cpu: bool = False  # it runs on the CPU but dequantizes every step there
    packed_shapes: bool = False  # a checkpoint's tensor shapes do not give its linears' sizes

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


def fallbacks(prefer_quality: bool = False) -> list[str]:
    """What the planner tries where 16-bit weights do not fit, best first: formats a load rounds
    a 16-bit checkpoint to, the opt-in ones (slower) only with `prefer_quality`."""
    tried = [f for f in _REGISTRY.values() if f.quantized and f.rounds_at_load
             and (f.fallback or prefer_quality)]
    return [f.name for f in sorted(tried, key=lambda f: f.quality)]


def floats() -> tuple[WeightFormat, ...]:
    """The plain float formats: a checkpoint's own dtype is one of these."""
    return tuple(f for f in _REGISTRY.values() if not f.quantized)


def offered() -> tuple[str, ...]:
    return tuple(f.name for f in _REGISTRY.values() if f.offered)


_LOADERS = "engine.load.weight_loaders:"
for _fmt in (WeightFormat("bf16", 16, "bfloat16", "BF16", tensor_parallel=True),
             WeightFormat("fp16", 16, "float16", "F16", tensor_parallel=True),
             WeightFormat("fp32", 32, "float32", "F32", tensor_parallel=True, offered=False),
             # LLM.int8: int8 CB and an fp32 scale (SCB) per output row; a prefill matmul keeps
             # int8 inputs and int32 outputs
             WeightFormat("int8", 8, library="bitsandbytes", loader=_LOADERS + "INT8",
                          linear_bytes=lambda out, inp, group, dq: out * inp + 4 * out,
                          prefill_scratch=lambda linears, tokens: tokens * max(
                              (4 * o + i for o, i, _ in linears), default=0),
                          quality=1, slow_on_cpu=True, packed_shapes=True),
             WeightFormat("nf4", 4, library="bitsandbytes", expert_groups=(64,),
                          expert_group_numbers=1,  # bitsandbytes' block: an absmax
                          loader=_LOADERS + "NF4", linear_bytes=_nf4_bytes,
                          prefill_scratch=_dequantized_matrix, quality=3, fallback=True,
                          slow_on_cpu=True, packed_shapes=True),
             # the engine's own int4 layers (quant/int4_linear.py): a scale and an offset
             WeightFormat("awq", 4, expert_groups=(128, 64, 32), expert_group_numbers=2,
                          loader=_LOADERS + "AWQ", linear_bytes=_awq_bytes,
                          prefill_scratch=_dequantized_matrix, quality=2, rounds_at_load=False)):
    register(_fmt)
