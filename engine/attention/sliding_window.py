"""Attention of a sliding-window layer (Gemma 3's local layers): the query at position p sees the
keys at p - window + 1 .. p, as transformers' sliding-window mask has it. The cache keeps every
position's K/V (the planner counts them all); this reads a contiguous copy of the positions below
`kv_len` through the layer's block table and masks the keys outside each query's window, so it
serves prefill chunks, decode steps, verify blocks and one row of a batched step alike."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.cache import kv_arena
from engine.cache.kv_cache import LayerKV


def mask(pos: torch.Tensor, kv_len: int, window: int) -> torch.Tensor:
    """pos [T] -> [T, kv_len] bool: key j visible to the query at p where p - window < j <= p."""
    keys = torch.arange(kv_len, device=pos.device)[None, :]
    return (keys <= pos[:, None]) & (keys > pos[:, None] - window)


def attend(q: torch.Tensor, kv: LayerKV, pos: torch.Tensor, kv_len: int, window: int,
           scale: float) -> torch.Tensor:
    """q [1, H, T, D] at positions pos [T] over kv's positions 0..kv_len-1 (the queries' own
    K/V written already) -> [1, T, H D] in q's dtype."""
    k, v = kv_arena.gather(*kv, kv_len, q.dtype)  # [1, H_kv, kv_len, D]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask(pos, kv_len, window)[None, None],
                                         scale=scale, enable_gqa=True)
    return out.transpose(1, 2).reshape(1, q.shape[2], q.shape[1] * q.shape[3])
