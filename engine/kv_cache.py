"""The engine's own KV cache: one preallocated static buffer per layer, written in place.

Not transformers' Cache: the model runs with no transformers cache at all, and the engine's
attention function (attention.py) writes K/V here at explicit positions. Shapes never change
after allocation, which is what later lets a decode step be replayed as a CUDA graph.
"""

from __future__ import annotations

import torch


class KVCache:
    """K and V for batch 1: `k[layer]`, `v[layer]`: [1, H_kv, max_len, D] in `dtype`.

    `token_ids` are the tokens whose K/V sit at positions 0..len-1 (what a later turn may reuse).
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (1, num_kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len
        self.dtype = dtype
        self.token_ids: list[int] = []

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """k, v: [1, H_kv, T, D] at `positions` ([T], int64, same device)."""
        self.k[layer].index_copy_(2, positions, k.to(self.dtype))
        self.v[layer].index_copy_(2, positions, v.to(self.dtype))

    def crop(self, length: int) -> None:
        """Forget everything from `length` on: later writes overwrite it, reads stop before it."""
        del self.token_ids[length:]

    def reusable_prefix(self, ids: list[int]) -> int:
        """How many leading tokens of `ids` already have their K/V here."""
        n = 0
        for a, b in zip(self.token_ids, ids, strict=False):
            if a != b:
                break
            n += 1
        return n
