"""What the family step (models/layers.py) reads besides its cache: which models it covers, the
part of the model a step holds (`Shard`: rank r of N), and its weights, found by the family's
module names (formats/families). Not the math, nor the cut for N ranks (parallel/sharded_step.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.formats import families


@dataclass(frozen=True)
class Shard:
    """The part of the model one step holds: rank `rank` of `world_size` (0 of 1: all of it).

    Column-parallel q/k/v and gate/up keep this rank's rows of their outputs (whole heads, equal
    MLP slices); row-parallel o and down the same columns of their inputs, so each rank's product
    is a partial sum that the step's all-reduce completes (parallel/all_reduce.py).
    """

    rank: int = 0
    world_size: int = 1

    def local(self, count: int) -> int:
        """This rank's share of `count` heads or columns (the cut divides them evenly)."""
        return count // self.world_size

    def rows(self, total: int) -> slice:
        """This rank's rows of a dimension of `total`, in rank order."""
        n = self.local(total)
        return slice(self.rank * n, (self.rank + 1) * n)


WHOLE = Shard()


@dataclass
class LayerParams:
    """One decoder layer: plain weights where they are plain, else the module itself."""

    qkv: torch.nn.Module | torch.Tensor  # fused [q; k; v] weight for plain linears
    qkv_bias: torch.Tensor | None
    o: torch.nn.Module | torch.Tensor
    gate_up: torch.nn.Module | torch.Tensor  # fused [gate; up] for plain linears
    down: torch.nn.Module | torch.Tensor
    ln_in: torch.Tensor
    ln_post: torch.Tensor
    q_norm: torch.Tensor | None  # Qwen3: RMSNorm over each head before RoPE
    k_norm: torch.Tensor | None
    o_bias: torch.Tensor | None = None  # Llama's attention_bias: added once, after the sum


@dataclass
class StepWeights:
    """The whole model's sizes (a shard divides the head counts itself) and one shard's tensors."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    scaling: float  # attention's softmax scale
    rope_scale: float  # the rotary embedding's attention_scaling
    embed: torch.Tensor  # [V, hidden], replicated
    norm: torch.Tensor
    inv_freq: torch.Tensor  # [D/2] fp32
    # a weight, a quantized module, or a callable that gathers a vocabulary-parallel product
    lm_head: torch.nn.Module | torch.Tensor | Callable[[torch.Tensor], torch.Tensor]
    layers: list[LayerParams]


def family_of(model) -> families.Family | None:
    """The model's registered family where it runs the fast path, else None."""
    family = families.get(getattr(model.config, "model_type", None))
    return family if family is not None and family.fast_path else None


def in_family(model) -> bool:
    """A fast-path family with a bias-free MLP: the shapes the step's math covers."""
    family = family_of(model)
    if family is None:
        return False
    n = family.names
    layer = model.get_submodule(n.layers)[0]
    return all(getattr(layer.get_submodule(m), "bias", None) is None
               for m in (n.gate, n.up, n.down) if m)


def supports(model) -> bool:
    """The fused step adds biases to q/k/v only (Qwen2's); a model with a bias on o_proj
    (Llama's attention_bias) decodes through transformers' modules on one device."""
    if not in_family(model):
        return False
    family, cfg = family_of(model), model.config
    # the family step's attention is SDPA's: soft-capped attention logits only on Gemma's step
    capped = getattr(cfg, "attn_logit_softcapping", None) is not None
    bias = model.get_submodule(family.names.layers)[0].get_submodule(family.names.o).bias
    return bias is None and (family.sliding_layers or not capped) and _whole_fixed_rope(model)


def _whole_fixed_rope(model) -> bool:
    """RoPE over each head's every dimension, from frequencies fixed at load: the step's table
    (not a partial rotary factor, nor longrope or dynamic scaling, which change with length)."""
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    kinds = [r for r in rope.values() if isinstance(r, dict)] or [rope]
    if any(r.get("rope_type", r.get("type")) in ("longrope", "dynamic") for r in kinds):
        return False
    inv_freq, _ = rope_of(model.get_submodule(family_of(model).names.rotary))
    return 2 * inv_freq.numel() == head_dim_of(cfg)


def head_dim_of(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def weights_of(model) -> StepWeights:
    """The whole model's weights as the step reads them: plain linears fused in place (each
    module's weight becomes a view of the fused one: no extra memory), other modules as they are."""
    cfg, family = model.config, family_of(model)
    n = family.names
    num_heads = cfg.num_attention_heads
    lm_head = model.get_submodule(n.lm_head)
    rotary = model.get_submodule(n.rotary)
    inv_freq, rope_scale = rope_of(rotary)
    layers = model.get_submodule(n.layers)
    return StepWeights(
        num_heads=num_heads, num_kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim_of(cfg),
        eps=cfg.rms_norm_eps, scaling=layers[0].get_submodule(n.attn).scaling,
        rope_scale=rope_scale,
        embed=model.get_submodule(n.embed).weight, norm=model.get_submodule(n.norm).weight,
        inv_freq=inv_freq,
        lm_head=lm_head.weight if _is_plain(lm_head) else lm_head,
        layers=[_params(layer, family) for layer in layers])


def rope_of(rotary, layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """A rotary embedding's inverse frequencies [D/2] (fp32) and attention scaling; where it
    holds one set per layer type (Gemma 3: local and global bases), `layer_type`'s, the global
    layers' by default; where it holds one set, that one for every type (Gemma 2)."""
    if hasattr(rotary, "inv_freq"):
        return rotary.inv_freq.float(), float(getattr(rotary, "attention_scaling", 1.0))
    kind = layer_type or "full_attention"
    return (getattr(rotary, f"{kind}_inv_freq").float(),
            float(getattr(rotary, f"{kind}_attention_scaling", 1.0)))


def _is_plain(*mods) -> bool:
    return all(type(m) is torch.nn.Linear for m in mods)


def _plain(mod):
    """A plain linear's weight, else the module itself."""
    return mod.weight if _is_plain(mod) else mod


def _fuse(mods: list[torch.nn.Linear]) -> torch.Tensor:
    """Concatenate weights once and make each module's weight a view: no extra memory."""
    fused = torch.cat([m.weight.data for m in mods])
    row = 0
    for m in mods:
        n = m.weight.shape[0]
        m.weight.data = fused[row: row + n]
        row += n
    return fused


def _params(layer, family: families.Family) -> LayerParams:
    """One decoder layer's weights, found by the family's module names."""
    n = family.names
    if n.fused:  # one linear each for [q; k; v] and [gate; up]: the layout the step reads
        return _fused_params(layer, n)
    q, k, v, o, gate, up, down = (layer.get_submodule(name) for name in n.linears)
    if _is_plain(q, k, v):
        qkv = _fuse([q, k, v])
        bias = None
        if q.bias is not None:
            bias = torch.cat([q.bias, k.bias, v.bias])
    else:
        qkv, bias = _concat(q, k, v), None
    gate_up = _fuse([gate, up]) if _is_plain(gate, up) else _concat(gate, up)
    if hasattr(gate_up, "choose_glu"):  # the int4 layers' SiLU * up inside the product
        gate_up.choose_glu()
    norm = lambda name: layer.get_submodule(name).weight if family.qk_norm else None
    return LayerParams(qkv, bias, _plain(o), gate_up, _plain(down),
                       layer.get_submodule(n.ln_in).weight, layer.get_submodule(n.ln_post).weight,
                       norm(n.q_norm), norm(n.k_norm), o.bias if _is_plain(o) else None)


def _fused_params(layer, n: families.ModuleNames) -> LayerParams:
    qkv, o, gate_up, down = (layer.get_submodule(name) for name in (n.q, n.o, n.gate, n.down))
    return LayerParams(_plain(qkv), qkv.bias, _plain(o), _plain(gate_up), _plain(down),
                       layer.get_submodule(n.ln_in).weight, layer.get_submodule(n.ln_post).weight,
                       None, None, o.bias if _is_plain(o) else None)


def _concat(*mods) -> torch.nn.Module:
    """One fused layer where the modules know how to share one matrix (the engine's int4 layers:
    Int4Linear.concat), else each called in turn."""
    fuse = getattr(type(mods[0]), "concat", None)
    fused = fuse(list(mods)) if fuse and all(type(m) is type(mods[0]) for m in mods) else None
    return fused if fused is not None else _Concat(*mods)


class _Concat(torch.nn.Module):
    """Quantized linears cannot share one weight: call each and concatenate the outputs."""

    def __init__(self, *mods):
        super().__init__()
        self.mods = mods

    def forward(self, x):
        return torch.cat([m(x) for m in self.mods], dim=-1)
