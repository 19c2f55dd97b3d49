"""4-bit experts: a mixture of experts' 16-bit [E, N, K] weights rounded at load into the
stacked layout the grouped product reads (kernels/experts/packed.py), and the module holding
them in place of transformers' experts module.

Two roundings, one expert at a time (so a 16-bit stack never sits on the card whole):
- "awq": round-to-nearest with a zero point per group of G input features (awq_format.quantize,
  the formula the engine's int4 layers hold: offset = (8 - z) * scale), G the largest of 128,
  64, 32 that divides K;
- "nf4": each block of 64 input features scaled by its absmax, each weight the nearest of NF4's
  16 codes (bitsandbytes' code and blocksize; no double quantization of the absmax).
"""

from __future__ import annotations

import torch

from engine.formats import weights
from engine.kernels.attention_backend import triton_available
from engine.kernels.experts import grouped
from engine.kernels.experts.packed import Packed4, code_values
from engine.quant import awq_format
from engine.quant.int4_linear import pack_rows

FORMATS = tuple(name for name in weights.names() if weights.get(name).expert_groups)


def group_size(quant: str, K: int) -> int:
    """The group K input features are cut in (formats/weights.py); ValueError (one sentence)
    where no group the format takes divides K."""
    group = weights.expert_group(quant, K)
    if group is None:
        groups = weights.get(quant).expert_groups
        raise ValueError(f"{quant} groups input features by {' or '.join(map(str, groups))}; "
                         f"this model's {K} are a multiple of none")
    return group


def quantize(weight: torch.Tensor, quant: str, dtype: torch.dtype,
             device: torch.device) -> Packed4:
    """weight [E, N, K] (anywhere, any float dtype) -> its 4-bit form on `device`, scales and
    offsets in `dtype` (the compute dtype)."""
    E, N, K = weight.shape
    G = group_size(quant, K)
    packed = torch.empty(E, N, K // 8, dtype=torch.int32, device=device)
    scales = torch.empty(E, K // G, N, dtype=dtype, device=device)
    offsets = torch.empty_like(scales) if quant == "awq" else None
    table = code_values(True, device)
    midpoints = (table[1:] + table[:-1]) / 2  # a value's nearest code: how many it is past
    for e in range(E):
        w = weight[e].to(device, torch.float32)  # [N, K]
        if quant == "awq":
            codes, zeros, s = awq_format.quantize(w, G)  # codes [N, K], zeros, s [K/G, N]
            offsets[e] = ((8 - zeros.float()) * s).to(dtype)
        else:
            blocks = w.view(N, K // G, G)
            absmax = blocks.abs().amax(-1).clamp(min=torch.finfo(torch.float32).tiny)
            codes = torch.bucketize(blocks / absmax[..., None], midpoints).view(N, K)
            s = absmax.t()  # [K/G, N]
        scales[e] = s.to(dtype)
        packed[e] = pack_rows(codes)
    return Packed4(packed, scales, offsets)


def random(shape: tuple[int, int, int], quant: str, dtype: torch.dtype, device: torch.device,
           g: torch.Generator) -> Packed4:
    """Random 4-bit experts of `shape` [E, N, K] made on `device` (speed runs from config.json
    alone): uniform codes, weights of std about 0.02 (the usual initializer range)."""
    E, N, K = shape
    G = group_size(quant, K)
    packed = torch.randint(-2**31, 2**31, (E, N, K // 8), generator=g, device=device,
                           dtype=torch.int32)
    # awq: (q - 8) has std ~4.6; nf4: the code's values, std ~0.5
    base, spread = (0.0034, 0.002) if quant == "awq" else (0.03, 0.02)
    scales = (torch.rand(E, K // G, N, generator=g, device=device) * spread + base).to(dtype)
    offsets = torch.zeros_like(scales) if quant == "awq" else None
    return Packed4(packed, scales, offsets)


class Experts4(torch.nn.Module):
    """transformers 5's experts module (forward(hidden, top_k_index, top_k_weights), SiLU-gated
    [gate; up] then down) with 4-bit weights: the grouped product over the routed experts, the
    Triton kernel on a GPU. Parameters (frozen), so memory footprints count them as weights."""

    def __init__(self, gate_up: Packed4, down: Packed4):
        super().__init__()
        for name, w in (("gate_up", gate_up), ("down", down)):
            for part in ("packed", "scales", "offsets"):
                t = getattr(w, part)
                self.register_parameter(f"{name}_{part}", None if t is None else
                                        torch.nn.Parameter(t, requires_grad=False))
        self.num_experts = gate_up.shape[0]

    def _packed(self, name: str) -> Packed4:
        return Packed4(*(getattr(self, f"{name}_{part}") for part in ("packed", "scales",
                                                                       "offsets")))

    @property
    def gate_up_proj(self) -> Packed4:
        return self._packed("gate_up")

    @property
    def down_proj(self) -> Packed4:
        return self._packed("down")

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        kernel = "triton" if hidden.is_cuda and triton_available() else "reference"
        return grouped.product(hidden.to(self.gate_up_scales.dtype), self.gate_up_proj,
                               self.down_proj, top_k_index, top_k_weights,
                               kernel).to(hidden.dtype)

    @classmethod
    def of(cls, experts: torch.nn.Module, quant: str, dtype: torch.dtype,
           device: torch.device) -> Experts4:
        """transformers' experts module (16-bit gate_up_proj, down_proj) rounded to `quant`."""
        return cls(quantize(experts.gate_up_proj.data, quant, dtype, device),
                   quantize(experts.down_proj.data, quant, dtype, device))
