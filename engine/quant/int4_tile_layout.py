"""The "mma" int4 layout (kernels/int4_mma_kernel.py): codes arranged so that one 32-bit word is
one lane's share of a 16 x 16 weight tile in the A operand of the tensor cores' m16n8k16 product,
and four consecutive k-tiles of a lane are one 16-byte load (a warp reads 512 contiguous bytes).

packed [N/16, K/64, 32, 4] int32: row tile T, k-group j (64 k), lane l = 4 g + t, word c (the
k-tile at k0 = 64 j + 16 c). The word's nibbles, low first, are the codes of
  0: (row g, k0 + 2t)      4: (row g, k0 + 2t + 1)
  1: (row g + 8, k0 + 2t)  5: (row g + 8, k0 + 2t + 1)
  2: (row g, k0 + 2t + 8)  6: (row g, k0 + 2t + 9)
  3: (row g + 8, ...)      7: (row g + 8, k0 + 2t + 9)   (rows within tile T)
so (word >> 4i) & 0x000F000F holds the pair of A register i (the fragment's a0..a3).
Rows and columns need N % 16 == 0 and K % 64 == 0.
"""

from __future__ import annotations

import torch


def fits(N: int, K: int) -> bool:
    return N % 16 == 0 and K % 64 == 0


PACK_BYTES = 64 << 20  # int64 codes arranged at once: a 7B's down_proj whole would take 1.6 GB


def pack(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K] (0..15) -> packed [N/16, K/64, 32, 4] int32, a slice of row tiles at a time
    (loads convert layers on the card that will hold them, which may have little room left)."""
    N, K = codes.shape
    step = max(16, PACK_BYTES // (8 * K) // 16 * 16)
    if N > step:
        return torch.cat([_pack(codes[n:n + step]) for n in range(0, N, step)])
    return _pack(codes)


def _pack(codes: torch.Tensor) -> torch.Tensor:
    N, K = codes.shape
    # row = 16 T + 8 h + g; k = 64 j + 16 c + 8 kh + 2 t + e
    c = codes.to(torch.int64).view(N // 16, 2, 8, K // 64, 4, 2, 4, 2)
    #                              T      h  g  j       c  kh t  e
    c = c.permute(0, 3, 2, 6, 4, 7, 5, 1)  # [T, j, g, t, c, e, kh, h]: nibble = 4 e + 2 kh + h
    c = c.reshape(N // 16, K // 64, 32, 4, 8)
    words = (c << torch.arange(0, 32, 4, device=codes.device)).sum(-1)  # < 2^32
    return (words - ((words >> 31) << 32)).to(torch.int32)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """packed [N/16, K/64, 32, 4] int32 -> codes [N, K] uint8 (pack's inverse)."""
    NT, KJ = packed.shape[:2]
    words = packed.to(torch.int64) & 0xFFFFFFFF
    nib = (words[..., None] >> torch.arange(0, 32, 4, device=packed.device)) & 0xF
    c = nib.view(NT, KJ, 8, 4, 4, 2, 2, 2)  # [T, j, g, t, c, e, kh, h]
    c = c.permute(0, 7, 2, 1, 4, 6, 3, 5)  # [T, h, g, j, c, kh, t, e]
    return c.reshape(NT * 16, KJ * 64).to(torch.uint8)
