"""A mixture of experts' weights in 4 bits, stacked by expert: what the grouped product reads in
place of a 16-bit [E, N, K] tensor (grouped.py: the reference indexes it by expert; the 4-bit
kernel, grouped4_kernel.py, reads its tensors). Quantizing is quant/experts4.py's.

Codes are packed eight to an int32 word along the input features, k = 8 w + j in bits 4j..4j+3
(int4_linear.pack_rows' layout, each expert's rows on their own), with a scale per group of G
input features and output row:
    AWQ (round-to-nearest, zero point): W_e[n, k] = (q - 8) * scale[e, g, n] + offset[e, g, n]
    NF4 (a 16-entry code table):        W_e[n, k] = NF4[q] * scale[e, g, n]     (absmax, G = 64)
with g = k // G, computed in fp32 and rounded once to the compute dtype.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from engine.kernels.int4_dequant_kernel import NF4_CODES


def code_values(codebook: bool, device: torch.device | str) -> torch.Tensor:
    """[16] fp32: what each code stands for before its scale (NF4's table, or q - 8). Made once
    a device: a copy to the GPU inside a CUDA graph's capture would break it."""
    return _code_values(codebook, str(torch.device(device)))


@functools.cache
def _code_values(codebook: bool, device: str) -> torch.Tensor:
    values = NF4_CODES if codebook else range(-8, 8)
    return torch.tensor(values, dtype=torch.float32).to(device)


def unpack(words: torch.Tensor) -> torch.Tensor:
    """[..., N, K/8] int32 -> codes [..., N, K] uint8 (little-endian bytes: codes 2b, 2b+1 in
    byte b)."""
    b = words.contiguous().view(torch.uint8)  # [..., N, K/2]
    return torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)


@dataclass
class Packed4:
    """One projection of every expert in 4 bits: packed [E, N, K/8] int32, scales [E, K/G, N] in
    the compute dtype, offsets the same shape (AWQ) or None (NF4: `codebook`)."""

    packed: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor | None

    @property
    def codebook(self) -> bool:
        return self.offsets is None

    @property
    def shape(self) -> tuple[int, int, int]:
        """(E, N, K): the 16-bit tensor's shape it stands for."""
        E, N, W = self.packed.shape
        return E, N, 8 * W

    @property
    def group_size(self) -> int:
        return self.shape[2] // self.scales.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.scales.dtype

    @property
    def device(self) -> torch.device:
        return self.packed.device

    def __getitem__(self, e) -> torch.Tensor:
        """Expert e's weight [N, K] in the compute dtype: that expert's tensors alone are read."""
        _, N, K = self.shape
        G = self.group_size
        codes = unpack(self.packed[e]).view(N, K // G, G).long()
        w = code_values(self.codebook, self.device)[codes]  # [N, K/G, G] fp32
        w = w * self.scales[e].t().float()[..., None]
        if self.offsets is not None:
            w = w + self.offsets[e].t().float()[..., None]
        return w.view(N, K).to(self.dtype)
