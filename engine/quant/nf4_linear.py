"""The engine's NF4 layer: bitsandbytes' NF4 codes and absmax (one per 64 weights along a row) in
the "mma" layout (quant/int4_tile_layout.py), run by the int4 kernels' codebook variant: a decode
step's rows through kernels/int4_gemv_kernel.py, longer inputs dequantized by
kernels/int4_dequant_kernel.py for cuBLAS (quant/int4_cuda.py).

W[n, k] = code[q] * absmax[k // 64, n], rounded once to bf16: bitsandbytes computes the product
in fp32 and rounds it once; here the code and the absmax are bf16 first (two more roundings of at
most half a bf16 step each). The same codes: `from_bnb` reads a quantized bitsandbytes layer, so
an NF4 model loads as before (transformers' loader or quant/bnb.py quantizes), and `convert`
swaps its layers on a CUDA device where the kernels check out.
"""

from __future__ import annotations

import functools

import torch

from engine.kernels.int4_dequant_kernel import NF4_CODES, nf4_bf16
from engine.quant import int4_cuda, int4_tile_layout
from engine.quant.int4_linear import Int4Linear

BLOCK = 64  # bitsandbytes' NF4 blocksize, the one the layout's k-groups hold whole


class Nf4Linear(Int4Linear):
    """y = x W^T + bias; scales_zeros holds the absmax [K/64, N] bf16 (no offsets)."""

    codebook = True

    def dequantize(self) -> torch.Tensor:
        """W [N, K] bf16, the kernels' bits."""
        N, K = self.out_features, self.in_features
        codes = int4_tile_layout.unpack(self.packed, codebook=True).view(N, K // BLOCK, BLOCK)
        table = nf4_bf16().to(self.packed.device)
        s = self.scales_zeros.t()[..., None]  # [N, K/64, 1]
        return (table[codes.long()] * s).view(N, K)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16)
        out = int4_cuda.matmul(x2, self.packed, self.scales_zeros, BLOCK, codebook=True)
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)

    @classmethod
    def from_codes_absmax(cls, codes: torch.Tensor, absmax: torch.Tensor,
                          bias: torch.Tensor | None) -> Nf4Linear:
        """codes [N, K] (0..15) and absmax [N, K/64] (fp32), on the layer's CUDA device."""
        N, K = codes.shape
        packed = int4_tile_layout.pack(codes, codebook=True)
        int4_cuda.reserve(codes.device, N, K)  # the dense path's buffer, before graph capture
        sz = absmax.t().to(torch.bfloat16).contiguous()  # [K/64, N]
        return cls(K, N, BLOCK, "mma", packed, sz,
                   None if bias is None else bias.to(torch.bfloat16))

    @classmethod
    def from_bnb(cls, module) -> Nf4Linear | None:
        """A bitsandbytes Linear4bit's NF4 layer in this form, or None where it does not fit
        (another quant type, code or blocksize; shapes the layout cannot tile; not bf16; tensors
        whose sizes disagree with the layer's, as a malformed checkpoint's may)."""
        import bitsandbytes.functional as bnbf

        qs = getattr(module.weight, "quant_state", None)
        N, K = module.out_features, module.in_features
        b = module.weight.data.reshape(-1)  # [N K / 2] uint8, element 2i in the high nibble
        if (qs is None or qs.quant_type != "nf4" or qs.blocksize != BLOCK
                or not int4_tile_layout.fits(N, K) or qs.dtype != torch.bfloat16
                or b.dtype != torch.uint8 or 2 * b.numel() != N * K
                or qs.absmax.numel() != N * K // BLOCK or qs.code.numel() != len(NF4_CODES)
                or not torch.allclose(qs.code.float().cpu(), torch.tensor(NF4_CODES), rtol=0,
                                      atol=1e-7)):
            return None
        codes = torch.stack((b >> 4, b & 0xF), dim=-1).view(N, K)
        absmax = qs.absmax
        if qs.nested:  # double quantization: 8-bit absmax, its own blocks' scales and offset
            absmax = bnbf.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset
        bias = None if module.bias is None else module.bias.data
        return cls.from_codes_absmax(codes, absmax.float().view(N, K // BLOCK), bias)


@functools.cache
def kernels_ok(device: str) -> bool:
    """Whether the codebook kernels compile here and give the dequantized reference's product at
    the gemv's row counts and through the dense path: once per device, on a small random layer."""
    if not device.startswith("cuda"):
        return False
    g = torch.Generator().manual_seed(0)
    N, K = 208, 512
    try:
        codes = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8).to(device)
        absmax = (torch.rand(N, K // BLOCK, generator=g) + 0.5).to(device)
        lin = Nf4Linear.from_codes_absmax(codes, absmax, None)
        return int4_cuda.matches_reference(lin, (1, 4, 5, 65), g)
    except Exception:  # noqa: BLE001 - no NVRTC, a failed compile or launch: bitsandbytes
        return False


def convert(model: torch.nn.Module) -> int:
    """Each bitsandbytes NF4 layer of `model` on a CUDA device swapped for an Nf4Linear where it
    fits and the kernels check out there (the rest stay bitsandbytes'); how many were swapped."""
    import bitsandbytes as bnb

    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, bnb.nn.Linear4bit) or child.weight.device.type != "cuda":
                continue
            if not kernels_ok(str(child.weight.device)):
                return swapped
            new = Nf4Linear.from_bnb(child)
            if new is not None:
                setattr(parent, name, new)
                swapped += 1
    return swapped
