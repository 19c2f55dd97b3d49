"""An orthonormal rotation of keys and queries for a quantized (int8/fp8) KV cache.

A cache with a scale per 32 elements of a head (kernels/kv_quant.py) spends each group's few
levels on the group's largest element. Keys have outlier channels (a few of D much larger than
the rest, whatever the token), so the other channels of an outlier's group round coarsely.
Rotating each key by an orthonormal R (D x D) spreads an outlier over all D channels; rotating
the query by the same R keeps every score, (q R)(k R)^T = q R R^T k^T = q k^T, so attention
reads the rotated cache as it is, in every kernel, with no change to how it stores or reads
blocks.

R: the normalized Hadamard matrix (entries +-1/sqrt(D)) where D is a power of two, applied as
the fast Walsh-Hadamard transform (kernels/kv_quant.rotate); otherwise a fixed orthonormal
matrix from a seeded QR (the same on every run and device). Applied after RoPE, to the keys
before the cache quantizes them and to the queries before attention reads the cache, where
the KV dtype asks for it (formats/kv_dtypes.py: int8 and fp8). The transform's butterflies
give a row the same bits whatever else its pass holds (a product's rounding depends on the row
count), so a token's stored key does not depend on how its prompt was grouped into passes.
Values are not rotated: quantized alone, they cost a fraction of what the keys cost.
"""

from __future__ import annotations

import functools
import math

import torch

from engine.kernels import kv_quant

SEED = 0x4B56  # the seeded QR's, for a head size that is not a power of two


@functools.lru_cache(maxsize=8)
def _matrix(head_dim: int, device: str) -> torch.Tensor:
    if head_dim & (head_dim - 1) == 0:
        h = torch.ones(1, 1, dtype=torch.float64)
        while h.shape[0] < head_dim:  # Sylvester: [[H, H], [H, -H]]
            h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
        r = h / math.sqrt(head_dim)
    else:
        g = torch.Generator().manual_seed(SEED)
        r, upper = torch.linalg.qr(torch.randn(head_dim, head_dim, generator=g,
                                               dtype=torch.float64))
        r = r * torch.sign(torch.diagonal(upper))[None]  # a unique QR: diag(upper) > 0
    return r.to(torch.float32).to(device)


def matrix(head_dim: int, device: torch.device | str) -> torch.Tensor:
    """R: [head_dim, head_dim] fp32 on `device`, orthonormal (R R^T = I); one per device."""
    return _matrix(head_dim, str(torch.device(device)))


def rotate(x: torch.Tensor, r: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """x: [..., D] -> x R in fp32, returned in `dtype` (default: x's). Keys go to the cache's
    quantizer in fp32 (no extra rounding before it rounds); queries keep their own dtype."""
    return kv_quant.rotate(x, r).to(x.dtype if dtype is None else dtype)


def rotate_qk(q: torch.Tensor, k: torch.Tensor, r: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys of one pass, both rotated (keys in fp32), or as they are with r None
    (a 16-bit cache)."""
    if r is None:
        return q, k
    return rotate(q, r), rotate(k, r, torch.float32)
