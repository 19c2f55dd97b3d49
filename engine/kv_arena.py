"""The paged KV arena's storage: fixed-size blocks per layer, written and read through a block
table (block_manager.py decides which block holds what). Not wired into the decode path yet
(TODO(#8)): kv_cache.KVCache is what the engine runs on; this is its paged successor, tested
against it.

Layout per layer: k, v [num_blocks, H_kv, B, D] in the storage dtype (+ k_scale, v_scale
[num_blocks, H_kv, B] fp16 for int8/fp8, one scale per token per head as in kv_quant.py), so one
head's block is one contiguous [B, D] tile: what a kernel loads per table entry. Position p of a
sequence lives at block table[p // B], slot p % B. Writes and reads are fixed-shape tensor ops
with the table on the device (no host sync), so a step over them can be graph-captured.
"""

from __future__ import annotations

import torch

from engine import kv_quant
from engine.kv_cache import STORAGE


class KVArena:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int, kv_dtype: str, device: torch.device | str):
        self.kv_dtype, self.dtype = kv_dtype, STORAGE[kv_dtype]
        self.quantized = kv_dtype in kv_quant.STORAGE
        self.block_size, self.num_blocks = block_size, num_blocks
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        new = lambda: torch.zeros(shape, dtype=self.dtype, device=device)
        self.k = [new() for _ in range(num_layers)]
        self.v = [new() for _ in range(num_layers)]
        self.k_scale = self.v_scale = None
        if self.quantized:
            scale = lambda: torch.ones(shape[:3], dtype=torch.float16, device=device)
            self.k_scale = [scale() for _ in range(num_layers)]
            self.v_scale = [scale() for _ in range(num_layers)]

    @staticmethod
    def bytes_per_block(num_layers: int, num_kv_heads: int, head_dim: int, block_size: int,
                        kv_dtype: str) -> int:
        """K and V of one block across all layers, scales included: what the planner divides
        its KV budget by to size the arena."""
        values = STORAGE[kv_dtype].itemsize * head_dim
        scales = 2 if kv_dtype in kv_quant.STORAGE else 0  # one fp16 per token per head
        return 2 * num_layers * num_kv_heads * block_size * (values + scales)

    @property
    def num_bytes(self) -> int:
        tensors = self.k + self.v + (self.k_scale or []) + (self.v_scale or [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def _where(self, table: torch.Tensor, positions: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int64 -> (block ids [T], slots in the block [T])."""
        B = self.block_size
        return table[positions // B].long(), positions % B

    def write(self, layer: int, table: torch.Tensor, positions: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """k, v: [1, H_kv, T, D] at `positions` ([T] int64) of the sequence whose block table
        is `table` ([max_blocks] int32, same device)."""
        blocks, slots = self._where(table, positions)
        pairs = ((self.k[layer], self.k_scale, k), (self.v[layer], self.v_scale, v))
        for store, scales, x in pairs:
            x = x[0].transpose(0, 1)  # [T, H_kv, D]: advanced indices first, as store[b, :, s]
            if scales is None:
                store[blocks, :, slots] = x.to(store.dtype)
                continue
            q, s = kv_quant.quantize(x, store.dtype)  # q: [T, H_kv, D], s: [T, H_kv]
            if store.dtype is not torch.int8:  # fp8 has no index_put_: write its bytes
                store, q = store.view(torch.uint8), q.view(torch.uint8)
            store[blocks, :, slots] = q
            scales[layer][blocks, :, slots] = s

    def gather(self, layer: int, table: torch.Tensor, end: int, dtype: torch.dtype
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of positions 0..end-1, contiguous: [1, H_kv, end, D] in `dtype` (dequantized for
        int8/fp8): what prefill's SDPA and the CPU reference read, a copy KVCache.read makes
        only for quantized caches. The Triton kernel is to read blocks through the table."""
        n = -(-end // self.block_size)
        blocks = table[:n].long()
        out = []
        for store, scales in ((self.k[layer], self.k_scale), (self.v[layer], self.v_scale)):
            x = store[blocks]  # [n, H_kv, B, D]
            H, D = x.shape[1], x.shape[3]
            x = x.transpose(0, 1).reshape(H, n * self.block_size, D)[:, :end]  # [H_kv, end, D]
            if scales is None:
                out.append(x.to(dtype)[None])
                continue
            s = scales[layer][blocks].transpose(0, 1).reshape(H, -1)[:, :end]  # [H_kv, end]
            out.append(kv_quant.dequantize(x, s, dtype)[None])
        return out[0], out[1]
