"""Tensor parallelism for the families that allow it (formats/families): a loaded model's weights
cut for rank r of N, found by the family's module names, and the step over one rank's cut, which
is FamilyStep itself (models/layers.py) told its Shard and given the collectives.

Column-parallel [q; k; v] (whole KV heads with their query heads) and [gate; up]; row-parallel o
and down, each followed by one all-reduce; the lm_head cut by vocabulary and all-gathered;
embeddings and norms replicated. The processes and their lockstep live in parallel/follower.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from engine.cache.kv_cache import KVCache
from engine.events import BadRequest
from engine.formats import families, weights
from engine.models.layers import FamilyStep
from engine.models.step_weights import LayerParams, Shard, StepWeights, family_of, in_family
from engine.parallel.all_reduce import AllReduce

DTYPES = {f.name: getattr(torch, f.torch_dtype) for f in weights.floats()}  # "bf16": bfloat16
# all_gather_into_tensor is deprecated from torch 2.13 on; older torch has only it
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class TPSpec:
    """All a rank needs besides its weights: whole-model sizes (a rank holds 1/N of the heads and
    of the MLP columns) and the cache settings. JSON, so followers read it from the store."""

    world_size: int
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    eps: float
    rope_scale: float
    scaling: float
    dtype: str  # the weights': "bf16" | "fp16" | "fp32"
    tied: bool  # lm_head is the embedding: each rank cuts its own replicated copy
    qkv_bias: bool  # Qwen2
    o_bias: bool  # Llama's attention_bias
    qk_norm: bool  # Qwen3
    context: int
    kv_dtype: str
    memory_limit_gib: float | None = None  # per GPU
    buckets: tuple[int, ...] = ()  # rank 0's KV-length buckets: every rank picks the same one
    backends: str = ""  # rank 0's Backends as JSON ("": the defaults): every rank runs the same
    num_blocks: int | None = None  # every rank's arena (None: one context's worth): one layout

    @property
    def vocab_shard(self) -> int:
        """Rows of the lm_head per rank: equal sizes for the all-gather, the last one padded."""
        return -(-self.vocab_size // self.world_size)

    @property
    def local_sizes(self) -> tuple[int, int, int]:
        """One rank's rows of q, of k (and of v), and its MLP columns."""
        n, d = self.world_size, self.head_dim
        return self.num_heads // n * d, self.num_kv_heads // n * d, self.intermediate_size // n

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TPSpec:
        d = json.loads(text)
        return cls(**{**d, "buckets": tuple(d["buckets"])})


def valid_sizes(num_kv_heads: int, intermediate_size: int, most: int = 8) -> list[int]:
    return [n for n in range(2, most + 1) if num_kv_heads % n == 0 and intermediate_size % n == 0]


def spec_of(model, world_size: int, context: int, kv_dtype: str,
            memory_limit_gib: float | None = None) -> TPSpec:
    """The spec for cutting `model` N ways; BadRequest (one sentence) where it cannot be cut."""
    cfg, family = model.config, family_of(model)
    # the o_proj bias is added after the all-reduce here: only the MLP's must be absent
    if not in_family(model) or not family.tensor_parallel:
        raise BadRequest("tensor parallelism covers "
                         f"{families.listing(families.tensor_parallel_types())} (without MLP "
                         f"biases); this model is {cfg.model_type}")
    kv, inter = cfg.num_key_value_heads, cfg.intermediate_size
    if world_size < 2:
        raise BadRequest(f"tensor parallelism needs at least 2 ranks, got {world_size}")
    if kv % world_size or inter % world_size:
        sizes = ", ".join(map(str, valid_sizes(kv, inter))) or "none"
        raise BadRequest(f"--tensor-parallel {world_size} does not divide this model evenly: each "
                         f"GPU must hold whole KV heads ({kv}) and equal MLP slices ({inter}); "
                         f"it splits {sizes} ways")
    names = family.names
    layers = model.get_submodule(names.layers)
    linears = [model.get_submodule(names.lm_head)] + [
        layer.get_submodule(n) for layer in layers for n in names.linears]
    if any(type(m) is not torch.nn.Linear for m in linears):
        raise BadRequest("tensor parallelism cuts 16-bit weights; NF4 and INT8 shards are not "
                         "supported yet (use --quant bf16)")
    first = layers[0]
    q, o = first.get_submodule(names.q), first.get_submodule(names.o)
    embed = model.get_submodule(names.embed).weight
    lm_head = model.get_submodule(names.lm_head)
    return TPSpec(
        world_size=world_size, num_layers=len(layers), hidden_size=cfg.hidden_size,
        num_heads=cfg.num_attention_heads, num_kv_heads=kv,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        intermediate_size=inter, vocab_size=embed.shape[0], eps=float(cfg.rms_norm_eps),
        rope_scale=float(getattr(model.get_submodule(names.rotary), "attention_scaling", 1.0)),
        scaling=float(first.get_submodule(names.attn).scaling),
        dtype={v: k for k, v in DTYPES.items()}[embed.dtype],
        tied=lm_head.weight.data_ptr() == embed.data_ptr(),
        qkv_bias=q.bias is not None, o_bias=o.bias is not None,
        qk_norm=family.qk_norm, context=context, kv_dtype=kv_dtype,
        memory_limit_gib=memory_limit_gib)


def layout(spec: TPSpec) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """Name, shape and dtype of every tensor a rank holds, in the order rank 0 sends them."""
    d, hid, dt = spec.head_dim, spec.hidden_size, DTYPES[spec.dtype]
    hq, hkv, inter = spec.local_sizes
    out = [("embed", (spec.vocab_size, hid), dt), ("norm", (hid,), dt),
           ("inv_freq", (d // 2,), torch.float32)]
    if not spec.tied:
        out.append(("lm_head", (spec.vocab_shard, hid), dt))
    for i in range(spec.num_layers):
        p = f"layers.{i}."
        out.append((p + "qkv", (hq + 2 * hkv, hid), dt))
        out += [(p + "qkv_bias", (hq + 2 * hkv,), dt)] if spec.qkv_bias else []
        out.append((p + "o", (hid, hq), dt))
        out += [(p + "o_bias", (hid,), dt)] if spec.o_bias else []
        out += [(p + "gate_up", (2 * inter, hid), dt), (p + "down", (hid, inter), dt),
                (p + "ln_in", (hid,), dt), (p + "ln_post", (hid,), dt)]
        out += [(p + "q_norm", (d,), dt), (p + "k_norm", (d,), dt)] if spec.qk_norm else []
    return out


def shard(model, spec: TPSpec, rank: int, device) -> Iterator[tuple[str, torch.Tensor]]:
    """Rank `rank`'s tensors in layout() order, each a fresh copy on `device`, one at a time (so
    rank 0 never holds a whole follower's cut on its own GPU while sending it)."""
    part, d = Shard(rank, spec.world_size), spec.head_dim
    q_rows, kv_rows = part.rows(spec.num_heads * d), part.rows(spec.num_kv_heads * d)
    i_rows = part.rows(spec.intermediate_size)

    def own(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device, copy=True).contiguous()  # no view keeps the whole alive

    names = family_of(model).names
    yield "embed", own(model.get_submodule(names.embed).weight)
    yield "norm", own(model.get_submodule(names.norm).weight)
    yield "inv_freq", own(model.get_submodule(names.rotary).inv_freq.float())
    if not spec.tied:
        yield "lm_head", own(vocab_rows(model.get_submodule(names.lm_head).weight, rank, spec))
    for i, layer in enumerate(model.get_submodule(names.layers)):
        q, k, v, o, gate, up, down = (layer.get_submodule(n) for n in names.linears)
        p = f"layers.{i}."
        # query heads j < H/N ride with KV head j // G: rank r's rows of q, k and v are contiguous
        yield p + "qkv", own(torch.cat([q.weight[q_rows], k.weight[kv_rows],
                                        v.weight[kv_rows]]))
        if spec.qkv_bias:
            yield p + "qkv_bias", own(torch.cat([q.bias[q_rows], k.bias[kv_rows],
                                                 v.bias[kv_rows]]))
        yield p + "o", own(o.weight[:, q_rows])  # row-parallel: this rank's input features
        if spec.o_bias:
            yield p + "o_bias", own(o.bias)
        yield p + "gate_up", own(torch.cat([gate.weight[i_rows], up.weight[i_rows]]))
        yield p + "down", own(down.weight[:, i_rows])
        yield p + "ln_in", own(layer.get_submodule(names.ln_in).weight)
        yield p + "ln_post", own(layer.get_submodule(names.ln_post).weight)
        if spec.qk_norm:
            yield p + "q_norm", own(layer.get_submodule(names.q_norm).weight)
            yield p + "k_norm", own(layer.get_submodule(names.k_norm).weight)


def vocab_rows(weight: torch.Tensor, rank: int, spec: TPSpec) -> torch.Tensor:
    """Rows rank*Vs .. (rank+1)*Vs of a [V, hidden] table, zero-padded to Vs rows (a view when
    V divides evenly: a tied lm_head then costs no memory beside the replicated embedding)."""
    vs = spec.vocab_shard
    rows = weight[rank * vs: (rank + 1) * vs]
    if rows.shape[0] == vs:
        return rows
    return torch.cat([rows, rows.new_zeros(vs - rows.shape[0], rows.shape[1])])


class VocabParallel:
    """The lm_head cut by vocabulary: each rank's Vs logits, all-gathered, padding trimmed."""

    def __init__(self, weight: torch.Tensor, vocab_size: int, world_size: int):
        self.weight, self.vocab_size, self.world_size = weight, vocab_size, world_size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        local = F.linear(x, self.weight).view(T, -1)  # x: [1, T, hidden] -> [T, Vs]
        parts = local.new_empty(self.world_size * T, local.shape[1])
        _all_gather(parts, local)  # [N T, Vs]: rank r's rows at r T
        full = parts.view(self.world_size, T, -1).permute(1, 0, 2).reshape(T, -1)  # [T, N Vs]
        return full[:, : self.vocab_size].view(1, T, -1)


def rank_step(spec: TPSpec, rank: int, w: dict[str, torch.Tensor], cache: KVCache) -> FamilyStep:
    """The family step over rank `rank`'s cut (`w`, named as layout() names them; `cache` holds
    its KV heads only): o and down summed by an AllReduce (NCCL until Rank.setup finds a faster
    sum), the lm_head's vocabulary rows all-gathered."""
    n = spec.world_size
    lm = vocab_rows(w["embed"], rank, spec) if spec.tied else w["lm_head"]
    layers = [LayerParams(w[p + "qkv"], w.get(p + "qkv_bias"), w[p + "o"], w[p + "gate_up"],
                          w[p + "down"], w[p + "ln_in"], w[p + "ln_post"], w.get(p + "q_norm"),
                          w.get(p + "k_norm"), w.get(p + "o_bias"))
              for p in (f"layers.{i}." for i in range(spec.num_layers))]
    weights = StepWeights(spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.eps,
                          spec.scaling, spec.rope_scale, w["embed"], w["norm"], w["inv_freq"],
                          VocabParallel(lm, spec.vocab_size, n), layers)
    return FamilyStep(weights, cache, Shard(rank, n), AllReduce())
