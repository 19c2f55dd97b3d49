"""The KV cache dtypes (`--kv-dtype`), one entry each with the facts that hang on it.

No torch: the planner, request checks and the app read it; torch-side code maps `torch_dtype`
to a torch dtype itself. "auto" is a choice word, not a dtype: it is never registered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class KVDtype:
    name: str  # the --kv-dtype word
    bytes_per_element: int
    torch_dtype: str  # the torch attribute that stores it: "bfloat16", "float8_e4m3fn"
    # + fp16 scales per token per KV head, one per SCALE_GROUP elements, for K and for V
    # (kernels/kv_quant.py: value = q * scale); a scaled dtype is quantized on write
    scaled: bool = False
    qmax: float | None = None  # the largest |q| a scaled dtype stores
    # the Triton kernel converts it in hardware from this compute capability on; below, the
    # PyTorch reference reads it
    min_compute_capability: tuple[int, int] | None = None
    offered: bool = True  # listed in the app's pickers (fp32 is the CPU reference's dtype)
    # keys and queries rotated before keys are stored (cache/key_rotation.py): int8 and fp8,
    # whose group scales otherwise spend their levels on a key's outlier channels
    rotated_keys: bool = False


_REGISTRY: dict[str, KVDtype] = {}
# the elements of a head that share one scale in a scaled cache: one scale per token per head
# spends the few levels of int8/fp8 on the head's largest element, so the rest of a 64-wide
# head round coarsely (q8_0 of llama.cpp keeps a scale per 32 values for the same reason)
SCALE_GROUP = 32


def scale_groups(head_dim: int) -> int:
    """Scales per token per head: head_dim // SCALE_GROUP, or one for a head that is not a
    multiple of it; the cache's layout is [..., tokens, scale_groups] either way."""
    return head_dim // SCALE_GROUP if head_dim % SCALE_GROUP == 0 else 1


def register(kv: KVDtype) -> KVDtype:
    if kv.name == "auto" or kv.name in _REGISTRY:
        raise ValueError(f"KV dtype {kv.name!r} is taken")
    if kv.scaled and kv.qmax is None:
        raise ValueError(f"scaled KV dtype {kv.name!r} needs its qmax")
    _REGISTRY[kv.name] = kv
    return kv


def unregister(name: str) -> None:
    del _REGISTRY[name]


def get(name: str) -> KVDtype:
    """KeyError for a name never registered: callers check `names()` first for their message."""
    return _REGISTRY[name]


def names() -> tuple[str, ...]:
    """Every KV dtype, in registration order (the order error messages list them in)."""
    return tuple(_REGISTRY)


def quantized() -> tuple[str, ...]:
    """The scaled dtypes: fp16 scales per token per head (scale_groups) beside the values."""
    return tuple(k.name for k in _REGISTRY.values() if k.scaled)


def offered() -> tuple[str, ...]:
    return tuple(k.name for k in _REGISTRY.values() if k.offered)


class NameView(Sequence[str]):
    """A set of names read from the registry at each use, for a module that names it once as a
    constant (`kv_dtype in QUANTIZED_KV`): a dtype registered after import still counts."""

    def __init__(self, names: Callable[[], tuple[str, ...]]):
        self._names = names

    def __getitem__(self, index):
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


def runs_natively(name: str, compute_capability) -> bool:
    """Whether a card of this compute capability converts `name` in hardware (None: unknown)."""
    need = _REGISTRY[name].min_compute_capability
    return need is None or (compute_capability is not None
                            and tuple(compute_capability) >= need)


def eight_bit_for(compute_capability) -> str:
    """The quantized cache for a card: the most demanding scaled dtype it converts in hardware
    (fp8 from cc 8.9 on, int8 below or when the card is unknown)."""
    fits = [k for k in _REGISTRY.values()
            if k.scaled and runs_natively(k.name, compute_capability)]
    return max(fits, key=lambda k: k.min_compute_capability or (0, 0)).name


for _kv in (KVDtype("bf16", 2, "bfloat16"), KVDtype("fp16", 2, "float16"),
            KVDtype("fp32", 4, "float32", offered=False),
            # e4m3fn's largest finite value; Ada and Hopper convert it in hardware
            KVDtype("fp8", 1, "float8_e4m3fn", scaled=True, qmax=448.0,
                    min_compute_capability=(8, 9), rotated_keys=True),
            KVDtype("int8", 1, "int8", scaled=True, qmax=127.0,
                    rotated_keys=True)):  # symmetric int8
    register(_kv)
