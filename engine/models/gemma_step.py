"""Gemma 2 and 3's step: the family step (models/layers.py) with Gemma's math where it differs.

Every RMSNorm scales by (1 + weight) in fp32 before the cast back (the weights are made so here,
once: the model's own stay as they are for transformers' modules); a norm after attention and
one after the MLP, before each residual add; the embedding times sqrt(hidden); GELU (tanh) in
place of SiLU; the logits soft-capped where the config says. Local layers (layer_types
"sliding_attention") take RoPE of their own base and attend within their window
(attention/sliding_window.py, through the cache's attention: window_of); global layers run the
family step's attention unchanged, but where the attention logits are soft-capped (Gemma 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.cache.kv_cache import KVCache
from engine.models import invariant
from engine.models.layers import Attention, FamilyStep
from engine.models.step_weights import StepWeights, family_of, rope_of, weights_of

GLOBAL = "full_attention"


@dataclass
class GemmaParts:
    """What Gemma's step reads beyond the family step's weights."""

    post_attn: list[torch.Tensor]  # each layer's (1 + weight), fp32
    post_mlp: list[torch.Tensor]
    kinds: list[str]  # each layer's type: "sliding_attention" or "full_attention"
    windows: list[int | None]  # each layer's window; None: global
    rope: dict[str, tuple[torch.Tensor, float]]  # layer type -> (inv_freq, attention scaling)
    embed_scale: torch.Tensor  # sqrt(hidden) in the embedding's dtype, as transformers rounds it
    softcap: float | None  # final_logit_softcapping
    attn_softcap: float | None  # attn_logit_softcapping (Gemma 2): every layer's attention


def step_of(model, cache: KVCache) -> FamilyStep:
    """The whole model's step on one device: Gemma's where its family masks windowed layers,
    the experts' where a mixture of experts replaces the MLP."""
    from engine.models.moe_step import MoeStep

    family = family_of(model)
    kind = GemmaStep if family.sliding_layers else MoeStep if family.experts else FamilyStep
    return kind.of(model, cache)


def _plus_one(w: torch.Tensor) -> torch.Tensor:
    return 1.0 + w.float()


def _gemma(model, w: StepWeights) -> GemmaParts:
    """Gemma's parts of the model, and its norms in `w` made (1 + weight)."""
    cfg, n = model.config, family_of(model).names
    layers = model.get_submodule(n.layers)
    for p in w.layers:
        p.ln_in, p.ln_post = _plus_one(p.ln_in), _plus_one(p.ln_post)
        if p.q_norm is not None:  # Gemma 3's; Gemma 2 has none
            p.q_norm, p.k_norm = _plus_one(p.q_norm), _plus_one(p.k_norm)
    w.norm = _plus_one(w.norm)
    kinds = list(cfg.layer_types)
    rotary = model.get_submodule(n.rotary)
    embed = model.get_submodule(n.embed)
    return GemmaParts(
        post_attn=[_plus_one(layer.post_attention_layernorm.weight) for layer in layers],
        post_mlp=[_plus_one(layer.post_feedforward_layernorm.weight) for layer in layers],
        kinds=kinds, windows=[cfg.sliding_window if k != GLOBAL else None for k in kinds],
        rope={k: rope_of(rotary, k) for k in set(kinds)},
        embed_scale=embed.embed_scale.to(embed.weight.dtype),
        softcap=getattr(cfg, "final_logit_softcapping", None),
        attn_softcap=getattr(cfg, "attn_logit_softcapping", None))


class GemmaStep(FamilyStep):
    fused_pieces = False  # the Triton pieces compute Llama's norm and SiLU (models/fused_ops.py)

    def __init__(self, weights: StepWeights, cache: KVCache, gemma: GemmaParts):
        self.gemma = gemma
        self.rope_tables: dict[str, invariant.RopeTable] | None = None
        super().__init__(weights, cache)

    @classmethod
    def of(cls, model, cache: KVCache) -> GemmaStep:
        weights = weights_of(model)
        return cls(weights, cache, _gemma(model, weights))

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # as Gemma3RMSNorm: normalize and scale by (1 + weight) in fp32, then cast back
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * w).to(x.dtype)

    @staticmethod
    def silu_mul(gate_up):  # the piece's name is the family step's; Gemma gates with GELU
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up

    def _mlp_in(self, h: torch.Tensor, w, f: dict) -> torch.Tensor:
        # never the int4 layers' own SiLU * up
        return f["silu_mul"](self._lin("gate_up", h, w))

    def _cos_sin_of(self, kind: str):
        inv_freq, scale = self.gemma.rope[kind]

        def cos_sin(pos: torch.Tensor, dtype: torch.dtype):
            emb = (pos[:, None].float() * inv_freq[None]).repeat(1, 2)  # [T, D]
            return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)
        return cos_sin

    def make_reproducible(self, tiles, bucket) -> None:
        super().make_reproducible(tiles, bucket)
        self.rope_tables = {k: invariant.RopeTable(self._cos_sin_of(k), self.cache.max_len,
                                                   self.embed.device, self.embed.dtype)
                            for k in self.gemma.rope}

    def window_of(self, i: int) -> tuple[int | None, float | None]:
        """A local layer's window, and Gemma 2's soft cap on every layer's attention logits."""
        return self.gemma.windows[i], self.gemma.attn_softcap

    def batch(self, tokens: torch.Tensor, pos: torch.Tensor, rows) -> torch.Tensor:
        """As the family step's, the sliding layers reading their rings (rows.ring)."""
        return self._logits(tokens, pos, self._batch_attention(pos, rows), self.fns,
                            table=rows.table, ring=rows.ring)[0]

    def _logits(self, token: torch.Tensor, pos: torch.Tensor, attention: Attention, fns: dict,
                last_only: bool = False, table: torch.Tensor | None = None,
                keep: torch.Tensor | None = None, ring: torch.Tensor | None = None
                ) -> torch.Tensor:
        """As FamilyStep._logits, in Gemma's order: x + post_attn(attn(ln_in(x))), then
        x + post_mlp(mlp(ln_post(x))); a RoPE table per layer type; the logits soft-capped.
        `table` (a batch's rows): the global layers' tables, `ring` the sliding layers' where
        the cache keeps their rings; else each layer's own (KVCache.layer), a global layer
        writing through KVCache.write_layer (the shared blocks below seq.keep skipped)."""
        f, g, cache = fns, self.gemma, self.cache
        x = F.embedding(token, self.embed)[None] * g.embed_scale  # [1, T, hidden]
        tables = self.rope_tables or {k: self._cos_sin_of(k) for k in g.rope}
        rope = {k: make(pos, x.dtype) for k, make in tables.items()}
        h = f["rms"](x, self.layers[0].ln_in)
        for i, p in enumerate(self.layers):
            kv = written = cache.layer(i)
            if table is None:
                written = cache.write_layer(i)
            else:
                kv = written = kv._replace(table=ring if i in cache.sliding else table)
            q = f["qkv_rope"](self._lin("qkv", h, p.qkv, p.qkv_bias), p.q_norm, p.k_norm,
                              *rope[g.kinds[i]], pos, *written)
            attn = f["rms"](self.row_parallel(attention(i, q, kv), p.o), g.post_attn[i])
            x, h = f["add_rms"](x, attn, p.ln_post)
            mlp = self.row_parallel(self._mlp_in(h, p.gate_up, f), p.down, kind="down")
            next_norm = self.layers[i + 1].ln_in if i + 1 < len(self.layers) else self.norm
            x, h = f["add_rms"](x, f["rms"](mlp, g.post_mlp[i]), next_norm)
        h = h[:, -1:] if last_only else h if keep is None else h[:, keep]
        logits = self._lin("lm_head", h, self.lm_head)
        if g.softcap is not None:
            logits = torch.tanh(logits / g.softcap) * g.softcap
        return logits
