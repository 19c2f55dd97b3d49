"""The family registry: one frozen `Family` per config.json `model_type`, and the questions the
engine, the planner and the app ask of it. Pure data: torch-side code reads the module names here
and does the reaching into modules itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ModuleNames:
    """Where a transformers model of one family keeps its parts, as `get_submodule` paths: the
    model-level ones from the CausalLM, the layer-level ones from one decoder layer."""

    layers: str  # the decoder layers (a ModuleList)
    embed: str
    norm: str  # the norm after the last layer
    rotary: str  # the rotary embedding: inv_freq and attention_scaling
    lm_head: str
    attn: str  # a layer's attention module: its `scaling`
    q: str  # [q; k; v] in one linear where k and v are "" (Phi-3's qkv_proj)
    k: str
    v: str
    o: str
    q_norm: str  # the per-head norms, read only where the family has them (Family.qk_norm)
    k_norm: str
    gate: str  # [gate; up] in one linear where up is "" (Phi-3's gate_up_proj)
    up: str
    down: str
    ln_in: str  # the norm before attention
    ln_post: str  # the norm before the MLP

    @property
    def fused(self) -> bool:
        """q/k/v and gate/up are one linear each (tensor parallelism and AWQ read them apart)."""
        return not self.k

    @property
    def linears(self) -> tuple[str, ...]:
        """A layer's linear layers: what tensor parallelism cuts and AWQ quantizes."""
        return self.q, self.k, self.v, self.o, self.gate, self.up, self.down

    @property
    def awq_groups(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """AWQ's scale groups, AutoAWQ's for this layout: (the op whose output they read, the
        linears that read it). v -> o folds only without GQA; awq_quantize checks the shapes."""
        return ((self.ln_in, (self.q, self.k, self.v)), (self.v, (self.o,)),
                (self.ln_post, (self.gate, self.up)), (self.up, (self.down,)))


@dataclass(frozen=True)
class SamplingPreset:
    """A family's sampling where a model's generation_config.json does not say (a GGUF import
    has none): None leaves that setting to the engine's default (formats/sampling_defaults.py).
    temperature 0 is greedy."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # 0: off
    repetition_penalty: float | None = None


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's model_type
    name: str  # in messages: "Qwen2"
    # config.json's `architectures` (transformers classes) Hearth loads; none: the planner
    # sizes this type but a load refuses it
    architectures: tuple[str, ...] = ()
    gguf_architecture: str | None = None  # GGUF's general.architecture that imports as this
    names: ModuleNames | None = None  # None: nothing in Hearth reaches into its modules
    fast_path: bool = False  # the engine's own step (models/layers.py); else transformers'
    tensor_parallel: bool = False  # parallel/sharded_step.py cuts it
    awq: bool = False  # `hearth quantize --method awq` takes it
    qkv_bias: bool = False  # q/k/v biases that config.json does not mention (Qwen2)
    qk_norm: bool = False  # an RMSNorm over each q and k head before RoPE (Qwen3)
    tied_by_default: bool = False  # lm_head is the embedding when config.json is silent
    gated_mlp: bool = True  # gate and up projections; else one up projection
    # sliding-window layers beside global ones (config.json's layer_types): the step masks each
    # to its own window, so the context is not capped at the window (load/loader.py)
    sliding_layers: bool = False
    layer_norms: int = 2  # RMSNorms a decoder layer holds (Gemma 3: four), for the planner
    planned_prefixes: tuple[str, ...] = ()  # other model_types the planner sizes like this one
    sampling: SamplingPreset = SamplingPreset()  # what its models answer well with by default

    @property
    def loads(self) -> bool:
        return bool(self.architectures)


_REGISTRY: dict[str, Family] = {}


def _problem(f: Family) -> str | None:
    """What makes an entry inconsistent, or None: the engine's paths read `names`."""
    if (f.fast_path or f.tensor_parallel or f.awq) and f.names is None:
        return "the fast path, tensor parallelism and AWQ read its module names"
    if f.fast_path and not f.loads:
        return "a family on the fast path must load (name its architectures)"
    if (f.tensor_parallel or f.awq) and f.names.fused:
        return "tensor parallelism and AWQ cut q, k, v, gate and up apart"
    if f.tensor_parallel and not f.fast_path:
        return "tensor parallelism runs the fast path's math"
    if f.gguf_architecture and not f.loads:
        return "a GGUF import must load as one of its architectures"
    return None


def register(family: Family) -> Family:
    """Add a family; ValueError where its model_type or an architecture is taken, or where the
    entry contradicts itself."""
    if family.model_type in _REGISTRY:
        raise ValueError(f"model type {family.model_type!r} is taken")
    taken = {a for f in _REGISTRY.values() for a in f.architectures}
    clash = sorted(taken & set(family.architectures))
    if clash:
        raise ValueError(f"architecture {clash[0]} is taken by another family")
    problem = _problem(family)
    if problem:
        raise ValueError(f"family {family.model_type!r}: {problem}")
    _REGISTRY[family.model_type] = family
    return family


def unregister(model_type: str) -> None:
    del _REGISTRY[model_type]


def registered() -> tuple[Family, ...]:
    """Every family, in registration order (the order messages list them in)."""
    return tuple(_REGISTRY.values())


def get(model_type: str | None) -> Family | None:
    return _REGISTRY.get(model_type) if isinstance(model_type, str) else None


def by_architecture(architecture: str) -> Family | None:
    """The family that loads `architecture` (a transformers class name), or None."""
    return next((f for f in _REGISTRY.values() if architecture in f.architectures), None)


def planned_as(model_type: str) -> Family | None:
    """The family whose shape rules the planner applies to `model_type`: its own, else one that
    claims it by prefix (Qwen3's MoE and VL text models count Qwen3's head norms), else None."""
    return get(model_type) or next((f for f in _REGISTRY.values() if any(
        model_type.startswith(p) for p in f.planned_prefixes)), None)


def fast_path_types() -> tuple[str, ...]:
    return tuple(f.model_type for f in _REGISTRY.values() if f.fast_path)


def tensor_parallel_types() -> tuple[str, ...]:
    return tuple(f.model_type for f in _REGISTRY.values() if f.tensor_parallel)


def awq_types() -> tuple[str, ...]:
    return tuple(f.model_type for f in _REGISTRY.values() if f.awq)


def listing(model_types: tuple[str, ...]) -> str:
    """'Llama, Mistral, Qwen2 and Qwen3': the families' names for a sentence."""
    names = [_REGISTRY[t].name for t in model_types]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


class _LiveMapping(Mapping):
    """A dict rebuilt from the registry at each use: a family registered later is in it."""

    def __init__(self, build: Callable[[], dict[str, str]]):
        self._build = build

    def __getitem__(self, key: str) -> str:
        return self._build()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._build())

    def __len__(self) -> int:
        return len(self._build())


# transformers class name -> model_type, for every family that loads
ARCHITECTURES: Mapping[str, str] = _LiveMapping(lambda: {
    a: f.model_type for f in _REGISTRY.values() for a in f.architectures})
# GGUF general.architecture -> the transformers class it imports as
GGUF_ARCHITECTURES: Mapping[str, str] = _LiveMapping(lambda: {
    f.gguf_architecture: f.architectures[0] for f in _REGISTRY.values() if f.gguf_architecture})
