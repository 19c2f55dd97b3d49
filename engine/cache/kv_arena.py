"""The paged KV arena's storage: fixed-size blocks per layer, written and read through a block
table (cache/block_manager.py decides which block holds what; kv_cache.KVCache puts the two together
and is what the engine runs on).

Layout per layer: k, v [num_blocks, H_kv, B, D] in the storage dtype (+ k_scale, v_scale
[num_blocks, H_kv, B, NG] fp16 for int8/fp8, NG scales per token per head as in
kernels/kv_quant.py), so one head's block is one contiguous [B, D] tile. Position p of a
sequence lives at block table[p // B], slot p % B. Writes and reads are fixed-shape tensor ops
with the table on the device (no host sync), so a step over them can be graph-captured.
"""

from __future__ import annotations

import torch

from engine.formats import kv_dtypes
from engine.kernels import kv_quant

# --kv-dtype name -> storage dtype; the scaled ones (int8, fp8) add fp16 scales per token per
# KV head (kv_dtypes.scale_groups)
STORAGE = kv_quant.StorageView(kv_dtypes.names)
DEQUANT_CHUNK_BLOCKS = 256  # 4,096 tokens: the fp32 transient of one chunk, not of the context


def store(values: torch.Tensor, scales: torch.Tensor | None, table: torch.Tensor,
          positions: torch.Tensor, x: torch.Tensor, fused: bool = False) -> None:
    """Write x: [1, H_kv, T, D] at `positions` ([T] int64) of the sequence whose block table is
    `table` ([max_blocks] int32; [>= T, max_blocks]: token t of sequence t, a batched step)
    into values: [num_blocks, H_kv, B, D] (+ scales:
    [num_blocks, H_kv, B, NG], quantized first for int8/fp8), in place. `fused`: quantize and store
    in one Triton launch (KVCache.fused_writes: where the kernel reads the cache)."""
    B = values.shape[2]
    x = x[0].transpose(0, 1)  # [T, H_kv, D]: advanced indices first, as values[b, :, s]
    if (fused and scales is not None and values.is_cuda
            and not torch.compiler.is_compiling()):
        from engine.kernels import kv_write_kernel  # Triton: imported only where it runs

        kv_write_kernel.quantize_store(values, scales, table, positions, x)
        return
    if table.dim() == 2:  # row t's table for token t
        rows = torch.arange(positions.shape[0], device=positions.device)
        blocks = table[rows, positions // B].long()
    else:
        blocks = table[positions // B].long()  # [T]
    slots = positions % B
    if scales is None:
        values[blocks, :, slots] = x.to(values.dtype)
        return
    q, s = kv_quant.quantize(x, values.dtype)  # q: [T, H_kv, D], s: [T, H_kv, NG]
    if values.dtype is not torch.int8:  # fp8 has no index_put_: write its bytes
        values, q = values.view(torch.uint8), q.view(torch.uint8)
    values[blocks, :, slots] = q
    scales[blocks, :, slots] = s


def contiguous(values: torch.Tensor, table: torch.Tensor, end: int) -> torch.Tensor:
    """values [num_blocks, H_kv, B, ...] -> positions 0..end-1 as stored: [1, H_kv, end, ...].
    A gather with shapes fixed by `end` (a host int): graph-capturable."""
    B = values.shape[2]
    n = -(-end // B)
    x = values[table[:n].long()]  # [n, H_kv, B, ...]
    x = x.transpose(0, 1).reshape(x.shape[1], n * B, *x.shape[3:])  # [H_kv, n B, ...]
    return x[None, :, :end]


def contiguous_rows(values: torch.Tensor, table: torch.Tensor, end: int) -> torch.Tensor:
    """values [num_blocks, H_kv, B, D] -> each row's positions 0..end-1 as stored, through its
    own row of table ([N, max_blocks]): [N, H_kv, end, D] (a batched step's SDPA)."""
    B = values.shape[2]
    n = -(-end // B)
    x = values[table[:, :n].long()]  # [N, n, H_kv, B, D]
    N, _, H, _, D = x.shape
    return x.transpose(1, 2).reshape(N, H, n * B, D)[:, :, :end]


def gather(k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor | None,
           v_scale: torch.Tensor | None, table: torch.Tensor, end: int, dtype: torch.dtype
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V of positions 0..end-1 as contiguous copies [1, H_kv, end, D] in `dtype`
    (dequantized for int8/fp8): what prefill's SDPA, the SDPA decode path and the PyTorch
    reference read. The Triton kernel reads the blocks in place instead."""
    out = []
    for values, scales in ((k, k_scale), (v, v_scale)):
        if scales is None:
            out.append(contiguous(values, table, end).to(dtype))
        else:
            out.append(dequantized(values, scales, table, end, dtype))
    return out[0], out[1]


def dequantized(values: torch.Tensor, scales: torch.Tensor, table: torch.Tensor, end: int,
                dtype: torch.dtype, chunk_blocks: int = DEQUANT_CHUNK_BLOCKS) -> torch.Tensor:
    """Positions 0..end-1 of an int8/fp8 layer dequantized into one [1, H_kv, end, D] tensor,
    chunk_blocks blocks at a time: done whole, the fp32 products of a long context stand at
    8x its int8 bytes at once, past the planner's count. Elementwise, so the bits equal the
    whole-tensor way."""
    B, H, D = values.shape[2], values.shape[1], values.shape[3]
    n = -(-end // B)
    ids = table[:n].long()
    out = torch.empty(H, n, B, D, dtype=dtype, device=values.device)
    for i in range(0, n, chunk_blocks):
        j = min(n, i + chunk_blocks)
        x = kv_quant.dequantize(values[ids[i:j]], scales[ids[i:j]], dtype)  # [c, H_kv, B, D]
        out[:, i:j].copy_(x.transpose(0, 1))
    return out.view(H, n * B, D)[None, :, :end]


class KVArena:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int, kv_dtype: str, device: torch.device | str):
        self.kv_dtype, self.dtype = kv_dtype, STORAGE[kv_dtype]
        self.quantized = kv_dtypes.get(kv_dtype).scaled
        self.block_size, self.num_blocks = block_size, num_blocks
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        new = lambda: torch.zeros(shape, dtype=self.dtype, device=device)
        self.k = [new() for _ in range(num_layers)]
        self.v = [new() for _ in range(num_layers)]
        self.k_scale = self.v_scale = None
        if self.quantized:
            scales = (*shape[:3], kv_dtypes.scale_groups(head_dim))
            scale = lambda: torch.ones(scales, dtype=torch.float16, device=device)
            self.k_scale = [scale() for _ in range(num_layers)]
            self.v_scale = [scale() for _ in range(num_layers)]

    @staticmethod
    def bytes_per_block(num_layers: int, num_kv_heads: int, head_dim: int, block_size: int,
                        kv_dtype: str) -> int:
        """K and V of one block across all layers, scales included: what the planner divides
        its KV budget by to size the arena."""
        values = STORAGE[kv_dtype].itemsize * head_dim
        scaled = kv_dtypes.get(kv_dtype).scaled  # fp16 scales per token per head
        scales = 2 * kv_dtypes.scale_groups(head_dim) if scaled else 0
        return 2 * num_layers * num_kv_heads * block_size * (values + scales)

    @property
    def num_bytes(self) -> int:
        tensors = self.k + self.v + (self.k_scale or []) + (self.v_scale or [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def _scales(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if not self.quantized:
            return None, None
        return self.k_scale[layer], self.v_scale[layer]

    def write(self, layer: int, table: torch.Tensor, positions: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor, fused: bool = False) -> None:
        """k, v: [1, H_kv, T, D] at `positions` ([T] int64) of the sequence whose block table
        is `table` ([max_blocks] int32, same device); `fused` as in store()."""
        ks, vs = self._scales(layer)
        store(self.k[layer], ks, table, positions, k, fused)
        store(self.v[layer], vs, table, positions, v, fused)

    def gather(self, layer: int, table: torch.Tensor, end: int, dtype: torch.dtype
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of positions 0..end-1, contiguous: [1, H_kv, end, D] in `dtype` (see gather)."""
        return gather(self.k[layer], self.v[layer], *self._scales(layer), table, end, dtype)

    def copy_block(self, src: int, dst: int) -> None:
        """Every layer's K/V (and scales) of block `src` into block `dst` (a shared partial
        block that a sequence is about to write into gets its own copy)."""
        for t in self.k + self.v + (self.k_scale or []) + (self.v_scale or []):
            t[dst].copy_(t[src])
