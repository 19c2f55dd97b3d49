"""Attention of a sliding-window layer (Gemma 2 and 3's local layers): the query at position p
sees the keys at p - window + 1 .. p, as transformers' sliding-window mask has it; and attention
with soft-capped logits (Gemma 2's: cap * tanh(scores / cap), which SDPA cannot do), windowed or
not. The cache keeps a sliding layer's window only, in a ring of blocks a sequence
(cache/sliding_pool.py) whose table names ring[i % ring size] for logical block i; this reads a
contiguous copy of the positions below `kv_len` through the layer's table (positions older than
the window alias newer ones there) and masks the keys outside each query's reach, so it serves
prefill chunks, decode steps, verify blocks and one row of a batched step alike."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mask(pos: torch.Tensor, kv_len: int, window: int | None) -> torch.Tensor:
    """pos [T] -> [T, kv_len] bool: key j visible to the query at p where p - window < j <= p
    (no window: j <= p)."""
    keys = torch.arange(kv_len, device=pos.device)[None, :]
    causal = keys <= pos[:, None]
    return causal if window is None else causal & (keys > pos[:, None] - window)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
           window: int | None, scale: float, softcap: float | None = None) -> torch.Tensor:
    """q [1, H, T, D] at positions pos [T] over k, v [1, H_kv, kv_len, D] of positions
    0..kv_len-1 (a gathered copy, the queries' own K/V written already; or a pass's own K/V,
    from position 0, longer than a sliding layer's ring) -> [1, T, H D] in q's dtype."""
    kv_len = k.shape[2]
    visible = mask(pos, kv_len, window)[None, None]
    if softcap is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale,
                                             enable_gqa=True)
    else:  # as transformers' eager attention: capped scores, softmax in fp32, cast back
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.tanh(q @ k.transpose(2, 3) * scale / softcap) * softcap
        scores = scores.masked_fill(~visible, float("-inf"))
        out = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v
    return out.transpose(1, 2).reshape(1, q.shape[2], q.shape[1] * q.shape[3])
