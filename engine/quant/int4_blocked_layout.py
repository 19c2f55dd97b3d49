"""The int4 layout of kernels/int4_blocked_kernel.py: AWQ's words, regrouped so that a program
streams one contiguous region. Not used by the engine's loader (the kernel's docstring says why).

A word holds 8 codes of one input k for 8 adjacent outputs, nibble i the output 8 c + ORDER[i]
(AWQ's own interleave, ORDER = 0, 2, 4, 6, 1, 3, 5, 7, which lets (word >> 4 j) & 0x000F000F
put two adjacent outputs' codes into two 16-bit halves at once).

The words are stored [N / LBN, K, LBN / 8]: block b holds outputs b LBN .. (b + 1) LBN - 1 for
every k, k-major, so a decode program (LBN outputs, all of K) reads LBN / 2 bytes per k, one
contiguous stretch. LBN (8, 16 or 32) is fixed at load, per layer, by its shape.
"""

from __future__ import annotations

import torch

ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds output 8 c + ORDER[i]
BLOCKS = (8, 16, 32)


def pack(codes: torch.Tensor, lbn: int) -> torch.Tensor:
    """codes [N, K] (0..15) -> [N / lbn, K, lbn / 8] int32."""
    if lbn not in BLOCKS:
        raise ValueError(f"int4 blocks of {', '.join(map(str, BLOCKS))} outputs, not {lbn}")
    N, K = codes.shape
    if N % lbn:
        raise ValueError(f"{N} outputs are not a multiple of {lbn}")
    c = codes.t().to(torch.int64).reshape(K, N // 8, 8)[..., list(ORDER)]  # [K, N/8, 8]
    words = (c << (4 * torch.arange(8, device=codes.device))).sum(-1)  # [K, N/8] < 2^32
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.view(K, N // lbn, lbn // 8).transpose(0, 1).contiguous()


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """[N / lbn, K, lbn / 8] int32 -> codes [N, K] uint8."""
    NB, K, C = packed.shape
    words = packed.transpose(0, 1).reshape(K, NB * C)  # [K, N/8]
    nib = (words[..., None] >> (4 * torch.arange(8, dtype=torch.int32, device=packed.device))) & 0xF
    codes = torch.empty_like(nib)
    codes[..., list(ORDER)] = nib  # nibble i -> output ORDER[i]
    return codes.reshape(K, NB * C * 8).t().to(torch.uint8).contiguous()


def block_for(N: int, sms: int = 132) -> int:
    """The widest block that still gives a decode product about 3 programs per multiprocessor
    (one program a block), so a small layer (a 7B's 3584 outputs) still fills the GPU."""
    for lbn in reversed(BLOCKS):
        if N % lbn == 0 and N // lbn >= 3 * sms:
            return lbn
    return next(b for b in BLOCKS if N % b == 0) if N % 8 == 0 else 0
