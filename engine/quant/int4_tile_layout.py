"""The "mma" int4 layout (kernels/int4_mma_kernel.py): codes arranged so that one 32-bit word is
one lane's share of a 16 x 16 weight tile in the A operand of the tensor cores' m16n8k16 product,
and four consecutive k-tiles of a lane are one 16-byte load (a warp reads 512 contiguous bytes).
The product's k order within a k-group of 64 is not the weights': a lane's sixteen k are two runs
of eight, so its share of x's B operand is two 16-byte loads (x [64 j + 8 t, + 8) and
[64 j + 32 + 8 t, + 8)) instead of eight 4-byte ones, and a group of 32 k stays two whole words.

packed [N/16, K/64, 32, 4] int32: row tile T, k-group j (64 k), lane l = 4 g + t, word c (the
product's k-tile c, over k0 = 64 j + 32 (c >> 1) + 8 t + 4 (c & 1)). The word's nibbles, low
first, are the codes of
  0: (row g, k0)           4: (row g, k0 + 1)
  1: (row g + 8, k0)       5: (row g + 8, k0 + 1)
  2: (row g, k0 + 2)       6: (row g, k0 + 3)
  3: (row g + 8, k0 + 2)   7: (row g + 8, k0 + 3)   (rows within tile T)
so (word >> 4i) & 0x000F000F holds the pair of A register i (the fragment's a0..a3). NF4's
codebook order (`codebook`) puts register i's pair in nibbles 2i and 2i + 1 instead, the order
its byte-permute lookup produces them in (kernels/int4_dequant_kernel.py, code_word).
Rows and columns need N % 16 == 0 and K % 64 == 0.
"""

from __future__ import annotations

import torch


def fits(N: int, K: int) -> bool:
    return N % 16 == 0 and K % 64 == 0


PACK_BYTES = 64 << 20  # int64 codes arranged at once: a 7B's down_proj whole would take 1.6 GB


def pack(codes: torch.Tensor, codebook: bool = False) -> torch.Tensor:
    """codes [N, K] (0..15) -> packed [N/16, K/64, 32, 4] int32, a slice of row tiles at a time
    (loads convert layers on the card that will hold them, which may have little room left)."""
    N, K = codes.shape
    step = max(16, PACK_BYTES // (8 * K) // 16 * 16)
    if N > step:
        return torch.cat([_pack(codes[n:n + step], codebook) for n in range(0, N, step)])
    return _pack(codes, codebook)


def _pack(codes: torch.Tensor, codebook: bool) -> torch.Tensor:
    N, K = codes.shape
    # row = 16 T + 8 h + g; k = 64 j + 32 c1 + 8 t + 4 c0 + 2 kh + e (word c = 2 c1 + c0)
    c = codes.to(torch.int64).view(N // 16, 2, 8, K // 64, 2, 4, 2, 2, 2)
    #                              T      h  g  j       c1 t  c0 kh e
    if codebook:
        c = c.permute(0, 3, 2, 5, 4, 6, 7, 1, 8)  # [.., c0, kh, h, e]: nibble 4 kh + 2 h + e
    else:
        c = c.permute(0, 3, 2, 5, 4, 6, 8, 7, 1)  # [T, j, g, t, c1, c0, e, kh, h]: 4e + 2kh + h
    c = c.reshape(N // 16, K // 64, 32, 4, 8)
    words = (c << torch.arange(0, 32, 4, device=codes.device)).sum(-1)  # < 2^32
    return (words - ((words >> 31) << 32)).to(torch.int32)


def unpack(packed: torch.Tensor, codebook: bool = False) -> torch.Tensor:
    """packed [N/16, K/64, 32, 4] int32 -> codes [N, K] uint8 (pack's inverse)."""
    NT, KJ = packed.shape[:2]
    words = packed.to(torch.int64) & 0xFFFFFFFF
    nib = (words[..., None] >> torch.arange(0, 32, 4, device=packed.device)) & 0xF
    c = nib.view(NT, KJ, 8, 4, 2, 2, 2, 2, 2)  # [T, j, g, t, c1, c0, e, kh, h] (codebook: kh, h, e)
    order = (0, 7, 2, 1, 4, 3, 5, 6, 8) if codebook else (0, 8, 2, 1, 4, 3, 5, 7, 6)
    c = c.permute(*order)  # [T, h, g, j, c1, t, c0, kh, e]
    return c.reshape(NT * 16, KJ * 64).to(torch.uint8)
