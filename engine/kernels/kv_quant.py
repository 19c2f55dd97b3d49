"""Quantized K/V: int8 (symmetric) and fp8 (e4m3fn), one fp16 scale per group of a head's elements
per token.

The math of a quantized cache and nothing else: where the values live is cache/kv_cache.py, who
reads them is attention/prefill.py and attention/decode_attention.py. Pure torch ops with fixed
shapes and no host sync, so quantize-on-write runs inside a captured CUDA graph and inside
torch.compile'd pieces; where the Triton decode kernel runs, kv_arena.store hands the same
rounding to one Triton launch instead (kernels/kv_write_kernel.py), outside torch.compile.

Scale layout (per layer, for K and for V alike): values [num_blocks, H_kv, B, D] int8 or fp8
and scales [num_blocks, H_kv, B, NG] fp16 in the paged arena (cache/kv_arena.py), NG =
kv_dtypes.scale_groups(D): element d of a token's head is q * scale[d // (D / NG)]. Groups of
32 elements: one scale for a whole 64-wide head spends its levels on the head's largest element
(a key's outlier channel) and rounds the rest coarsely. A token's scales depend on that token's
vector alone, so the bytes written are the same whether the token arrives alone, in a
speculative verify block or in a prefill chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch

from engine.formats import kv_dtypes


def storage(name: str) -> torch.dtype:
    """The torch dtype a KV dtype's values are stored in: the one place where the registry's
    name (engine/formats/kv_dtypes.py) becomes a torch dtype."""
    return getattr(torch, kv_dtypes.get(name).torch_dtype)


class StorageView(Mapping[str, torch.dtype]):
    """KV dtype name -> storage dtype over a set of registered names, read at each use (a dtype
    registered after import counts)."""

    def __init__(self, names: Callable[[], tuple[str, ...]]):
        self._names = names

    def __getitem__(self, name: str) -> torch.dtype:
        if name not in self._names():
            raise KeyError(name)
        return storage(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


STORAGE = StorageView(kv_dtypes.quantized)  # the scaled dtypes: int8, fp8
# a plain dict, read by quantize inside torch.compile(fullgraph=True): built once, at import
QMAX = {storage(name): kv_dtypes.get(name).qmax for name in kv_dtypes.quantized()}
# the smallest normal fp16: a subnormal scale keeps few bits, so amax / scale could land far
# above QMAX and clip; a vector this small (|x| < QMAX * 2^-14) loses under 2^-15 to the floor
SCALE_MIN = 2.0 ** -14
SCALE_MAX = 65504.0  # the largest fp16


def quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., D] float -> (q: [..., D] in `dtype`, scale: [..., NG] fp16) with x ~= q * scale
    per group of D / NG elements (NG = kv_dtypes.scale_groups(D)).

    The scale is rounded to fp16 before dividing, so dequantizing with the stored scale is
    consistent with what was quantized; int8 rounds to nearest, fp8 by the cast (nearest even).
    """
    qmax = QMAX[dtype]
    groups = kv_dtypes.scale_groups(x.shape[-1])
    x32 = x.float().unflatten(-1, (groups, -1))  # [..., NG, D / NG]
    amax = x32.abs().amax(-1)  # [..., NG]
    scale = (amax / qmax).clamp(SCALE_MIN, SCALE_MAX).to(torch.float16)
    y = x32 / scale.float()[..., None]  # |y| <= qmax up to the fp16 rounding of scale
    if dtype is torch.int8:
        return y.round().clamp(-qmax, qmax).to(torch.int8).flatten(-2), scale
    return y.clamp(-qmax, qmax).to(dtype).flatten(-2), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32
               ) -> torch.Tensor:
    """q: [..., D] int8/fp8, scale: [..., NG] fp16 -> [..., D] in `dtype` (multiplied in fp32)."""
    x = q.float().unflatten(-1, (scale.shape[-1], -1)) * scale.float()[..., None]
    return x.flatten(-2).to(dtype)


def rotate(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """x: [..., D] -> x R in fp32, for the rotation of keys and queries of a quantized cache
    (cache/key_rotation.py; r: R, [D, D] fp32). A normalized Hadamard R (D a power of two) is
    applied as the fast Walsh-Hadamard transform: sums and differences element by element, so
    a token's bits do not depend on how many rows its pass holds (a product's rounding does)."""
    x32, D = x.float(), x.shape[-1]
    if D & (D - 1):
        return x32 @ r
    h = 1
    while h < D:  # butterflies at stride h: (a, b) -> (a + b, a - b)
        y = x32.reshape(*x.shape[:-1], D // (2 * h), 2, h)
        x32 = torch.stack((y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]), dim=-2)
        h *= 2
    return x32.reshape(x.shape) * D ** -0.5
