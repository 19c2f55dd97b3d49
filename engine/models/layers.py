"""The engine's own step for the families on the fast path (formats/families: Llama, Mistral,
Qwen2, Qwen3), over one shard of the model: all of it on one device, or rank r's heads and MLP
columns under tensor parallelism (the same math, with a sum over ranks after o and down).

A one-token step over the loaded model's own weights and linear modules (bf16, bitsandbytes, int4)
with every shape fixed and every position in a device tensor, so the step can be captured as one
CUDA graph and, optionally, its small ops fused by torch.compile. transformers' modules stay the
reference (tests compare the two) and serve prefill and every other architecture on one device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F

from engine.attention import decode_attention, paged
from engine.cache import key_rotation, kv_arena
from engine.cache.kv_cache import KVCache, LayerKV
from engine.events import MAX_SPECULATIVE_TOKENS
from engine.models import invariant
from engine.models.step_weights import WHOLE, Shard, StepWeights, weights_of

# attention(layer index, q [1, H, T, D], that layer's cache) -> [1, T, H D]
Attention = Callable[[int, torch.Tensor, LayerKV], torch.Tensor]


class RowSum(Protocol):
    """A row-parallel product summed over the ranks (parallel/all_reduce.py's AllReduce)."""

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor: ...


def apply_linear(x: torch.Tensor, w, bias=None) -> torch.Tensor:
    return F.linear(x, w, bias) if isinstance(w, torch.Tensor) else w(x)


class FamilyStep:
    """The step over one shard: token [1] at position pos [1] -> logits [V], reading
    cache[:, :, :kv_len]; `block`, the same over T consecutive tokens (speculative verification);
    `prefill`, a chunk under causal flash attention.

    `kv_len` is a host int fixed per captured graph (a bucket); positions past `pos` inside it
    are masked, so one graph serves every position below its bucket. A shard of N > 1 holds H/N
    query heads, H_kv/N KV heads (its cache holds only those) and I/N MLP columns; `reduce` sums
    the row-parallel o and down over the ranks, and its lm_head gathers the vocabulary. At world
    size 1 there is nothing to sum: the step is the plain one, op for op.
    """

    def __init__(self, weights: StepWeights, cache: KVCache, shard: Shard = WHOLE,
                 reduce: RowSum | None = None):
        if shard.world_size > 1 and reduce is None:
            raise ValueError("a shard of several ranks needs their sum after o and down")
        w = weights
        self.cache, self.shard, self.reduce = cache, shard, reduce
        self.eps, self.scaling, self.rope_scale = w.eps, w.scaling, w.rope_scale
        self.num_heads = shard.local(w.num_heads)  # this shard's heads (column-parallel q/k/v)
        self.num_kv_heads = shard.local(w.num_kv_heads)
        self.head_dim = w.head_dim
        self.embed, self.norm, self.inv_freq = w.embed, w.norm, w.inv_freq
        self.lm_head = w.lm_head
        self.layers = w.layers
        self.invariant: invariant.RowTiles | None = None  # the reproducible mode's tiles
        self.rope_table: invariant.RopeTable | None = None
        self._bucket: Callable[[int], int] | None = None
        self._init_pieces()

    @classmethod
    def of(cls, model, cache: KVCache) -> FamilyStep:
        """The whole model's step, on one device (its plain linears fused in place)."""
        return cls(weights_of(model), cache)

    def _init_pieces(self) -> None:
        """The pieces between linear layers; fused_ops.compile_pieces and .enable swap in
        fused ones. Prefill chunks (chunk_fns) take the Triton ones at most, never compiled
        ones: each new chunk length would compile again; `prefill` keeps the PyTorch ones."""
        self.eager_fns = dict(rms=self.rms, qkv_rope=self.qkv_rope, add_rms=self.add_rms,
                              silu_mul=self.silu_mul)
        self.fns, self.chunk_fns = dict(self.eager_fns), dict(self.eager_fns)

    def make_reproducible(self, tiles: invariant.RowTiles, bucket: Callable[[int], int]) -> None:
        """The reproducible mode (models/invariant.py): products in `tiles`, RoPE from one
        table, and attention per row as its decode step runs it (`bucket`: a position's end
        -> the KV bucket its decode step reads)."""
        self.invariant, self._bucket = tiles, bucket
        self.rope_table = invariant.RopeTable(self.cos_sin, self.cache.max_len,
                                              self.embed.device, self.embed.dtype)

    def _lin(self, kind: str, x: torch.Tensor, w, bias=None) -> torch.Tensor:
        if self.invariant is None:
            return apply_linear(x, w, bias)
        return invariant.tiled(x, invariant.paired(lambda t: apply_linear(t, w, bias)),
                               self.invariant.rows[kind])

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
        int8/fp8 cache (scales: [num_blocks, H_kv, B], else None). Weights come as separate
        arguments so that one compiled graph serves every layer."""
        d, T = self.head_dim, qkv.shape[1]
        nq, nkv = self.num_heads * d, self.num_kv_heads * d
        q, k, v = qkv.split([nq, nkv, nkv], dim=-1)
        q = q.view(1, T, self.num_heads, d)  # [B, T, H, D]
        k = k.view(1, T, self.num_kv_heads, d)
        if q_norm is not None:
            q, k = self.rms(q, q_norm), self.rms(k, k_norm)
        # [1, H, T, D], [1, H_kv, T, D]; both rotated for an int8/fp8 cache (cache/key_rotation)
        q, k = key_rotation.rotate_qk(self.rope(q.transpose(1, 2), cos, sin),
                                      self.rope(k.transpose(1, 2), cos, sin),
                                      self.cache.key_rotation)
        v = v.view(1, T, self.num_kv_heads, d).transpose(1, 2)
        # one Triton launch quantizes and stores where the kernel reads the cache; never inside
        # torch.compile (inductor fuses kv_quant's ops there, and the backend lookup would break
        # its full graph)
        fused = not torch.compiler.is_compiling() and self.cache.fused_writes
        kv_arena.store(k_cache, k_scale, table, pos, k, fused)
        kv_arena.store(v_cache, v_scale, table, pos, v, fused)
        return q

    def add_rms(self, x, delta, w):
        """The residual add and the next norm in one piece: -> (x + delta, rms(x + delta))."""
        x = x + delta
        return x, self.rms(x, w)

    @staticmethod
    def silu_mul(gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def _mlp_in(self, h: torch.Tensor, w, f: dict) -> torch.Tensor:
        """SiLU(gate) * up of h's gate/up product: in the product's own launch where its layer
        has one (int4's decode rows: Int4Linear.silu_glu, checked at load to give the piece's
        bits) and fused pieces are not off, else the product, then the piece (always in the
        reproducible mode's tiles)."""
        glu = getattr(w, "silu_glu", None)
        fused = self.invariant is None and self.cache.backends.fused_ops != "off"
        out = glu(h) if glu is not None and fused else None
        return out if out is not None else f["silu_mul"](self._lin("gate_up", h, w))

    def row_parallel(self, x: torch.Tensor, w, bias: torch.Tensor | None = None,
                     kind: str = "o") -> torch.Tensor:
        """o and down: x holds this shard's input features -> the whole product, summed over the
        ranks (nothing to sum at world size 1); a bias is added once, after the sum."""
        y = self._lin(kind, x, w) if self.reduce is None else self.reduce.linear(x, w)
        return y if bias is None else y + bias

    def __call__(self, token: torch.Tensor, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """token: [1] int64, pos: [1] int64 (device tensors) -> logits [V].

        Linear layers run as they are (cuBLAS, bitsandbytes); the pieces between them are the
        ones torch.compile fuses.
        """
        return self._logits(token, pos, self._bucket_attention(pos, kv_len, 1), self.fns)[0, 0]

    def block(self, tokens: torch.Tensor, pos: torch.Tensor, kv_len: int,
              last_only: bool = False, first: int | None = None,
              keep: torch.Tensor | None = None, chunk: bool = False) -> torch.Tensor:
        """tokens: [T] at positions pos: [T] (consecutive) -> logits of every position [T, V]
        (of the last one only, [1, V], with last_only; of the K indices `keep` [K], [K, V]);
        `chunk`: a prefill chunk, through chunk_fns.

        Speculative verification: T tokens in one pass, each attending causally to the cache
        and to the block's earlier tokens (their K/V are written before attention reads).
        """
        T = tokens.shape[0]
        if self.invariant is not None and T > 1:
            if first is None:
                raise ValueError("a reproducible block needs its first position on the host")
            attention = self._row_attention(first, T)
        else:
            attention = self._bucket_attention(pos, kv_len, T)
        fns = self.chunk_fns if chunk else self.fns
        return self._logits(tokens, pos, attention, fns, last_only, keep=keep)[0]

    def batch(self, tokens: torch.Tensor, pos: torch.Tensor,
              rows: decode_attention.BatchRows) -> torch.Tensor:
        """One decode step of N sequences: tokens, pos: [N] (token i of sequence i, whose blocks
        are rows.table[i]) -> logits [N, V]. The linear layers take the N rows together; each
        row's attention reads its own blocks up to its own bucket, as its step alone does."""
        return self._logits(tokens, pos, self._batch_attention(pos, rows), self.fns,
                            table=rows.table)[0]

    def _batch_attention(self, pos: torch.Tensor, rows: decode_attention.BatchRows) -> Attention:
        att = paged.of(self.cache)
        return self._per_layer(lambda w, cap: att.batch(pos, rows, self.scaling,
                                                        self.invariant is not None, w, cap))

    def prefill_batch(self, tokens: torch.Tensor, pos: torch.Tensor, table: torch.Tensor,
                      attention: Attention, keep: torch.Tensor) -> torch.Tensor:
        """Prefill chunks of several sequences in one pass (models/prefill_batch.py builds the
        attention and the per-token tables) -> logits of the tokens at `keep` [K, V]."""
        return self._logits(tokens, pos, attention, self.chunk_fns, table=table, keep=keep)[0]

    def _row_attention(self, first: int, T: int) -> Attention:
        """The reproducible mode's attention for rows first..first+T-1, as their decode steps
        run it: the Triton kernel over each run of rows that share a KV bucket (its rows get
        the bits of single steps; runs no longer than a verify block: past that the kernel
        tiles and splits a pass as a prefill chunk), else one row at a time (PyTorch's kernels'
        order changes with the row count), as every windowed layer."""
        att, pos = paged.of(self.cache), torch.arange(first, first + T, device=self.embed.device)
        single = [paged.Row(t, t + 1, self._bucket(first + t + 1)) for t in range(T)]
        runs = [paged.Row(*run) for run in invariant.row_buckets(
            first, T, self._bucket, MAX_SPECULATIVE_TOKENS + 1)] if att.in_place else single
        return self._per_layer(lambda w, cap: att.over(
            pos, single if (w, cap) != (None, None) else runs, self.scaling, w, cap))

    def prefill(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """ids: [T] int64 at positions start..start+T-1 -> logits of the last one [V]; writes
        their K/V into the cache. As attention/prefill.py: causal flash attention over a
        contiguous copy of the blocks, no KV expansion (a rank's prefill: it has no
        transformers modules)."""
        end = start + ids.numel()
        self.cache.reserve(end)
        positions = torch.arange(start, end, device=ids.device)
        att = paged.of(self.cache)  # causal over the cache's first `end` positions
        attention = self._per_layer(lambda w, cap: att.causal(start, end, self.scaling, w, cap))
        return self._logits(ids, positions, attention, self.eager_fns, last_only=True)[0, 0]

    def _bucket_attention(self, pos: torch.Tensor, kv_len: int, T: int) -> Attention:
        """Decode and verify: keys up to the bucket's kv_len; key j is visible to the token at
        pos p when j <= p, the rest of the bucket is masked."""
        att = paged.of(self.cache)
        return self._per_layer(lambda w, cap: att.over(pos, [paged.Row(0, T, kv_len)],
                                                       self.scaling, w, cap))

    def window_of(self, i: int) -> tuple[int | None, float | None]:
        """Layer i's (window, logit soft cap): none in the family step (models/gemma_step.py)."""
        return None, None

    def _per_layer(self, make) -> Attention:
        """Each layer's attention, make(window, softcap) made once a pass for each kind."""
        made: dict = {}

        def attention(i: int, q: torch.Tensor, kv: LayerKV) -> torch.Tensor:
            kind = self.window_of(i)
            if kind not in made:
                made[kind] = make(*kind)
            return made[kind](q, kv)
        return attention

    def _logits(self, token: torch.Tensor, pos: torch.Tensor, attention: Attention, fns: dict,
                last_only: bool = False, table: torch.Tensor | None = None,
                keep: torch.Tensor | None = None) -> torch.Tensor:
        """token, pos: [T] -> logits [1, T, V] ([1, 1, V] with last_only; [1, K, V] for the
        K token indices `keep`): every layer's math, for decode, verify, prefill and batched
        steps alike; `attention` is what differs, and `table`, the block tables K/V are written
        through (None: the cache's live sequence; [>= T, max_blocks]: token t's in row t)."""
        f = fns
        x = F.embedding(token, self.embed)[None]  # [1, T, hidden]
        cos, sin = (self.cos_sin if self.rope_table is None else self.rope_table)(pos, x.dtype)
        h = f["rms"](x, self.layers[0].ln_in)
        for i, p in enumerate(self.layers):
            kv = self.cache.layer(i)
            if table is not None:
                kv = kv._replace(table=table)
            q = f["qkv_rope"](self._lin("qkv", h, p.qkv, p.qkv_bias), p.q_norm, p.k_norm, cos,
                              sin, pos, *kv)
            attn = attention(i, q, kv)
            x, h = f["add_rms"](x, self.row_parallel(attn, p.o, p.o_bias), p.ln_post)
            mlp = self.row_parallel(self._mlp_in(h, p.gate_up, f), p.down, kind="down")
            next_norm = self.layers[i + 1].ln_in if i + 1 < len(self.layers) else self.norm
            x, h = f["add_rms"](x, mlp, next_norm)
        h = h[:, -1:] if last_only else h if keep is None else h[:, keep]
        return self._lin("lm_head", h, self.lm_head)
