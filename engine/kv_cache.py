"""The engine's own KV cache: one preallocated static buffer per layer, written in place.

Not transformers' Cache: the model runs with no transformers cache at all, and the engine's
attention function (attention.py) writes K/V here at explicit positions. Shapes never change
after allocation, which is what later lets a decode step be replayed as a CUDA graph. In int8 or
fp8 every token is quantized as it is written (kv_quant.py), before anything reads it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine import kv_quant

# --kv-dtype name -> storage dtype; int8 and fp8 add one fp16 scale per token per KV head
STORAGE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
           **kv_quant.STORAGE}


class LayerKV(NamedTuple):
    """One layer's buffers: k, v [1, H_kv, L, D]; k_scale, v_scale [1, H_kv, L] fp16 or None."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None


class KVCache:
    """K and V for batch 1: `k[layer]`, `v[layer]`: [1, H_kv, max_len, D] in the storage dtype,
    and for int8/fp8 `k_scale[layer]`, `v_scale[layer]`: [1, H_kv, max_len] fp16.

    `token_ids` are the tokens whose K/V sit at positions 0..len-1 (what a later turn may reuse).
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype | str, device: torch.device | str):
        if isinstance(dtype, str):
            self.kv_dtype = dtype
        else:
            self.kv_dtype = next(name for name, d in STORAGE.items() if d == dtype)
        self.dtype = STORAGE[self.kv_dtype]
        self.quantized = self.kv_dtype in kv_quant.STORAGE
        shape = (1, num_kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=self.dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=self.dtype, device=device) for _ in range(num_layers)]
        self.k_scale = self.v_scale = None
        if self.quantized:
            scale = lambda: torch.ones(shape[:3], dtype=torch.float16, device=device)
            self.k_scale = [scale() for _ in range(num_layers)]
            self.v_scale = [scale() for _ in range(num_layers)]
        self.max_len = max_len
        self.token_ids: list[int] = []

    @property
    def num_bytes(self) -> int:
        """Every buffer allocated, scales included."""
        tensors = self.k + self.v + (self.k_scale or []) + (self.v_scale or [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def layer(self, i: int) -> LayerKV:
        return LayerKV(self.k[i], self.v[i], self.k_scale[i] if self.quantized else None,
                       self.v_scale[i] if self.quantized else None)

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """k, v: [1, H_kv, T, D] at `positions` ([T], int64, same device)."""
        kv = self.layer(layer)
        kv_quant.store(kv.k, kv.k_scale, positions, k)
        kv_quant.store(kv.v, kv.v_scale, positions, v)

    def read(self, layer: int, end: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of positions 0..end-1: [1, H_kv, end, D]. A 16-bit cache gives views in its own
        dtype; a quantized one a dequantized copy in `dtype` (prefill and the CPU reference)."""
        kv = self.layer(layer)
        if not self.quantized:
            return kv.k[:, :, :end], kv.v[:, :, :end]
        return (kv_quant.dequantize(kv.k[:, :, :end], kv.k_scale[:, :, :end], dtype),
                kv_quant.dequantize(kv.v[:, :, :end], kv.v_scale[:, :, :end], dtype))

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
