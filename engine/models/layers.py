"""The engine's own decode step for the families on the fast path (formats/families: Llama,
Mistral, Qwen2, Qwen3), reading each family's module names from its registry entry.

A one-token step over the loaded model's own weights and linear modules (bf16, bitsandbytes, int4)
with every shape fixed and every position in a device tensor, so the step can be captured as one
CUDA graph and, optionally, its small ops fused by torch.compile. transformers' modules stay the
reference (tests compare the two) and serve prefill and every other architecture.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention import decode_attention
from engine.cache import kv_arena
from engine.cache.kv_cache import KVCache
from engine.formats import families


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


def family_of(model) -> families.Family | None:
    """The model's registered family where it runs the fast path, else None."""
    family = families.get(getattr(model.config, "model_type", None))
    return family if family is not None and family.fast_path else None


def in_family(model) -> bool:
    """A fast-path family with a bias-free MLP: the shapes this file's math covers."""
    family = family_of(model)
    if family is None:
        return False
    n = family.names
    layer = model.get_submodule(n.layers)[0]
    return all(getattr(layer.get_submodule(m), "bias", None) is None
               for m in (n.gate, n.up, n.down))


def supports(model) -> bool:
    """The fused step adds biases to q/k/v only (Qwen2's); a model with a bias on o_proj
    (Llama's attention_bias) decodes through transformers' modules."""
    if not in_family(model):
        return False
    n = family_of(model).names
    return model.get_submodule(n.layers)[0].get_submodule(n.o).bias is None


def _is_plain(*mods) -> bool:
    return all(type(m) is torch.nn.Linear for m in mods)


def _fuse(mods: list[torch.nn.Linear]) -> torch.Tensor:
    """Concatenate weights once and make each module's weight a view: no extra memory."""
    fused = torch.cat([m.weight.data for m in mods])
    row = 0
    for m in mods:
        n = m.weight.shape[0]
        m.weight.data = fused[row: row + n]
        row += n
    return fused


def _linear(x: torch.Tensor, w, bias=None) -> torch.Tensor:
    return F.linear(x, w, bias) if isinstance(w, torch.Tensor) else w(x)


class FamilyStep:
    """The decode step: token [1] at position pos [1] -> logits [V], reading cache[:, :, :kv_len];
    and `block`, the same over T consecutive tokens (speculative verification).

    `kv_len` is a host int fixed per captured graph (a bucket); positions past `pos` inside it
    are masked, so one graph serves every position below its bucket.
    """

    def __init__(self, model, cache: KVCache):
        cfg, family = model.config, family_of(model)
        n = family.names
        self.cache = cache
        self.eps = cfg.rms_norm_eps
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.embed = model.get_submodule(n.embed).weight
        self.norm = model.get_submodule(n.norm).weight
        lm_head = model.get_submodule(n.lm_head)
        self.lm_head = lm_head if not _is_plain(lm_head) else lm_head.weight
        rotary = model.get_submodule(n.rotary)
        self.inv_freq = rotary.inv_freq.float()
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        layers = model.get_submodule(n.layers)
        self.scaling = layers[0].get_submodule(n.attn).scaling
        self.layers = [_params(layer, family) for layer in layers]
        self._init_pieces()

    def _init_pieces(self) -> None:
        """The pieces between linear layers; compile() and fused_ops.enable swap in fused ones."""
        self.fns = dict(rms=self.rms, qkv_rope=self.qkv_rope, add_rms=self.add_rms,
                        silu_mul=self.silu_mul)
        self.compiled = False

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # as transformers' RMSNorm: normalize in fp32, cast back, then scale
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * x32.to(x.dtype)

    def cos_sin(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's tables for positions pos [T]: cos, sin [T, D] in `dtype` (broadcast over
        [1, H, T, D]), computed in fp32 as transformers' rotary embedding does."""
        freqs = pos[:, None].float() * self.inv_freq[None]  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.rope_scale).to(dtype), (emb.sin() * self.rope_scale).to(dtype)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def qkv_rope(self, qkv, q_norm, k_norm, cos, sin, pos, k_cache, v_cache, k_scale, v_scale,
                 table):
        """qkv: [1, T, (H + 2 H_kv) D] -> q: [1, H, T, D]; writes these tokens' K/V at pos [T]
        through the block table into the arena (kv_cache.LayerKV), quantized first for an
        int8/fp8 cache (scales: [num_blocks, H_kv, B], else None).

        Weights come as separate arguments (not one object per layer) so that one compiled
        graph serves every layer; the quantize-on-write is inside it, with the other small ops.
        """
        d, T = self.head_dim, qkv.shape[1]
        nq, nkv = self.num_heads * d, self.num_kv_heads * d
        q, k, v = qkv.split([nq, nkv, nkv], dim=-1)
        q = q.view(1, T, self.num_heads, d)  # [B, T, H, D]
        k = k.view(1, T, self.num_kv_heads, d)
        if q_norm is not None:
            q, k = self.rms(q, q_norm), self.rms(k, k_norm)
        q = self.rope(q.transpose(1, 2), cos, sin)  # [1, H, T, D]
        k = self.rope(k.transpose(1, 2), cos, sin)  # [1, H_kv, T, D]
        v = v.view(1, T, self.num_kv_heads, d).transpose(1, 2)
        kv_arena.store(k_cache, k_scale, table, pos, k)
        kv_arena.store(v_cache, v_scale, table, pos, v)
        return q

    def add_rms(self, x, delta, w):
        """The residual add and the next norm in one piece: -> (x + delta, rms(x + delta))."""
        x = x + delta
        return x, self.rms(x, w)

    @staticmethod
    def silu_mul(gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def attend(self, q, kv, mask, kv_len: int):
        """Grouped-query attention without expanding KV heads: the G query heads that share a
        KV head become G queries of it. q: [1, H, T, D] -> [1, T, H * D]; mask: [1, 1, G T, kv]
        (one row for T = 1). SDPA cannot read the paged arena in place: it reads a contiguous
        copy of the bucket's blocks (16-bit caches without Triton only; see decode_attention)."""
        group, T, dtype = self.num_heads // self.num_kv_heads, q.shape[2], q.dtype
        k, v = kv_arena.gather(*kv, kv_len, kv.k.dtype)  # [1, H_kv, kv_len, D]
        # rows g T + t: head group g, token t  # [1, Hkv, G T, D]
        q = q.reshape(1, self.num_kv_heads, group * T, self.head_dim).to(k.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling).to(dtype)
        if T == 1:
            return out.reshape(1, 1, self.num_heads * self.head_dim)  # kernels may permute it
        out = out.view(1, self.num_kv_heads, group, T, self.head_dim).permute(0, 3, 1, 2, 4)
        return out.reshape(1, T, self.num_heads * self.head_dim)

    def __call__(self, token: torch.Tensor, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """token: [1] int64, pos: [1] int64 (device tensors) -> logits [V].

        Linear layers run as they are (cuBLAS, bitsandbytes); the pieces between them are the
        ones torch.compile fuses.
        """
        return self._logits(token, pos, kv_len)[0, 0]

    def block(self, tokens: torch.Tensor, pos: torch.Tensor, kv_len: int,
              last_only: bool = False) -> torch.Tensor:
        """tokens: [T] at positions pos: [T] (consecutive) -> logits of every position [T, V]
        (of the last one only, [1, V], with last_only: a short prefill chunk).

        Speculative verification: T tokens in one pass, each attending causally to the cache
        and to the block's earlier tokens (their K/V are written before attention reads).
        """
        return self._logits(tokens, pos, kv_len, last_only)[0]

    def _logits(self, token: torch.Tensor, pos: torch.Tensor, kv_len: int,
                last_only: bool = False) -> torch.Tensor:
        """token, pos: [T] -> logits [1, T, V] ([1, 1, V] with last_only)."""
        f = self.fns
        T = token.shape[0]
        x = F.embedding(token, self.embed)[None]  # [1, T, hidden]
        cos, sin = self.cos_sin(pos, x.dtype)
        # key j is visible to the token at pos p when j <= p; the rest of the bucket is masked
        # (by SDPA's mask here, or inside decode_attention from pos itself)
        how, mask = decode_attention.backend(self.cache), None
        if how == "sdpa":
            keys = torch.arange(kv_len, device=pos.device)
            if T == 1:
                mask = (keys <= pos)[None, None, None, :]  # [1, 1, 1, kv]
            else:
                group = self.num_heads // self.num_kv_heads
                mask = (keys[None, :] <= pos[:, None]).repeat(group, 1)[None, None]  # [1,1,G T,kv]
        h = f["rms"](x, self.layers[0].ln_in)
        for i, p in enumerate(self.layers):
            kv = self.cache.layer(i)
            q = f["qkv_rope"](_linear(h, p.qkv, p.qkv_bias), p.q_norm, p.k_norm, cos, sin, pos,
                              *kv)
            if how == "sdpa":
                attn = self.attend(q, kv, mask, kv_len)
            else:  # [1, H, T, D] -> [1, T, H D]
                attn = decode_attention.attend(q, kv, pos, kv_len, self.scaling, how)
                attn = attn.transpose(1, 2).reshape(1, T, self.num_heads * self.head_dim)
            x, h = f["add_rms"](x, _linear(attn, p.o), p.ln_post)
            mlp = _linear(f["silu_mul"](_linear(h, p.gate_up)), p.down)
            next_norm = self.layers[i + 1].ln_in if i + 1 < len(self.layers) else self.norm
            x, h = f["add_rms"](x, mlp, next_norm)
        return _linear(h[:, -1:] if last_only else h, self.lm_head)

    def compile(self) -> None:
        """Fuse the small ops between linear layers (norms, RoPE, residuals, cache writes): each
        piece compiles once and serves every layer, whatever format the linears are in."""
        import torch._dynamo.config as dynamo

        # one compiled version per token count: the step, and each speculative verify block
        dynamo.recompile_limit = max(dynamo.recompile_limit, 32)
        self.fns = {name: torch.compile(fn, fullgraph=True, dynamic=False)
                    for name, fn in self.fns.items()}
        self.compiled = True


def _params(layer, family: families.Family) -> LayerParams:
    """One decoder layer's weights, found by the family's module names."""
    n = family.names
    q, k, v, o, gate, up, down = (layer.get_submodule(name) for name in n.linears)
    if _is_plain(q, k, v):
        qkv = _fuse([q, k, v])
        bias = None
        if q.bias is not None:
            bias = torch.cat([q.bias, k.bias, v.bias])
    else:
        qkv, bias = _concat(q, k, v), None
    gate_up = _fuse([gate, up]) if _is_plain(gate, up) else _concat(gate, up)
    plain = lambda mod: mod.weight if _is_plain(mod) else mod
    norm = lambda name: layer.get_submodule(name).weight if family.qk_norm else None
    return LayerParams(qkv, bias, plain(o), gate_up, plain(down),
                       layer.get_submodule(n.ln_in).weight, layer.get_submodule(n.ln_post).weight,
                       norm(n.q_norm), norm(n.k_norm))


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
