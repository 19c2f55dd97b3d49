"""The AutoAWQ "GEMM" checkpoint format (what transformers + gptqmodel load as `quant_method:
"awq"`), to and from plain 4-bit codes. Pure torch, no kernels: quant/int4_linear.py holds those.

Per linear layer of in_features K and out_features N, group size G:
    qweight [K, N/8] int32, qzeros [K/G, N/8] int32, scales [K/G, N] fp16 (+ bias [N] fp16)
and the weight the layer multiplies by is W[k, n] = (q[k, n] - z[k/G, n]) * s[k/G, n]
(y = x @ W). Eight 4-bit codes share an int32 along the output dim, interleaved: nibble i holds
column 8 c + AWQ_ORDER[i] (AutoAWQ's order, kept by gptqmodel's pack_awq).
"""

from __future__ import annotations

import torch

BITS = 4
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds column AWQ_ORDER[i] of its 8
SHIFTS = tuple(range(0, 32, BITS))


def quantization_config(group_size: int) -> dict:
    """config.json's quantization_config for what `pack` writes."""
    return {"quant_method": "awq", "bits": BITS, "group_size": group_size, "zero_point": True,
            "version": "gemm", "modules_to_not_convert": None}


def check_config(qc: dict) -> int:
    """The group size of a loadable AWQ config; ValueError with one sentence otherwise."""
    bits = qc.get("bits") or qc.get("w_bit") or BITS
    if bits != BITS:
        raise ValueError(f"this AWQ checkpoint has {bits}-bit weights; Hearth loads 4-bit AWQ")
    version = str(qc.get("version") or qc.get("format") or "gemm").lower()
    if version != "gemm":
        raise ValueError(f"this AWQ checkpoint is in the {version!r} layout; Hearth loads "
                         "AutoAWQ's GEMM layout (version \"gemm\", the common one)")
    if qc.get("zero_point") is False:
        raise ValueError("this AWQ checkpoint has no zero points; Hearth loads zero-point AWQ")
    return int(qc.get("group_size") or qc.get("q_group_size") or 128)


def _pack_rows(codes: torch.Tensor) -> torch.Tensor:
    """codes [R, C] (0..15, C a multiple of 8) -> [R, C/8] int32 in AWQ's interleaved order."""
    R, C = codes.shape
    c = codes.to(torch.int64).view(R, C // 8, 8)[..., list(AWQ_ORDER)]  # [R, C/8, 8]
    shifts = torch.tensor(SHIFTS, dtype=torch.int64, device=codes.device)
    words = (c << shifts).sum(-1)  # [R, C/8], < 2^32
    return (words - ((words >> 31) << 32)).to(torch.int32)  # two's complement: nibble 7 is bit 31


def _unpack_rows(words: torch.Tensor) -> torch.Tensor:
    """[R, C/8] int32 -> codes [R, C] uint8: the inverse of _pack_rows."""
    R, W = words.shape
    shifts = torch.tensor(SHIFTS, dtype=torch.int32, device=words.device)
    nibbles = (words[..., None] >> shifts) & 0xF  # [R, C/8, 8], nibble order
    inverse = [AWQ_ORDER.index(j) for j in range(8)]  # column j sits in nibble inverse[j]
    return nibbles[..., inverse].reshape(R, W * 8).to(torch.uint8)


def pack(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor
         ) -> dict[str, torch.Tensor]:
    """codes [N, K] (0..15), zeros [K/G, N] (0..15), scales [K/G, N] -> {qweight, qzeros,
    scales} as AutoAWQ writes them (scales fp16)."""
    return {"qweight": _pack_rows(codes.t()), "qzeros": _pack_rows(zeros),
            "scales": scales.to(torch.float16).contiguous()}


def unpack(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The checkpoint's tensors -> codes [N, K] uint8, zeros [K/G, N] uint8, scales [K/G, N]."""
    K, N = qweight.shape[0], qweight.shape[1] * 8
    if qzeros.shape[1] * 8 != N or scales.shape[1] != N or qzeros.shape[0] != scales.shape[0]:
        raise ValueError(f"AWQ tensors disagree: qweight {tuple(qweight.shape)}, qzeros "
                         f"{tuple(qzeros.shape)}, scales {tuple(scales.shape)}")
    if K % scales.shape[0]:
        raise ValueError(f"{K} input features do not split into {scales.shape[0]} groups")
    return _unpack_rows(qweight).t().contiguous(), _unpack_rows(qzeros), scales


def dequantize(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The reference: W^T [N, K] fp32, W[k, n] = (q - z) s (what nn.Linear's weight would hold)."""
    G = codes.shape[1] // scales.shape[0]
    z = zeros.t().float().repeat_interleave(G, dim=1)  # [N, K]
    s = scales.t().float().repeat_interleave(G, dim=1)
    return (codes.float() - z) * s


def _ranges(w: torch.Tensor, max_vals: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, groups, G] fp32 -> scales, zeros [N, groups]: AutoAWQ's pseudo_quantize_tensor."""
    hi, lo = w.amax(-1), w.amin(-1)
    if max_vals is not None:  # AWQ's clip search: the range is [-max, max] ∩ [min, max]
        hi, lo = torch.minimum(hi, max_vals), torch.maximum(lo, -max_vals)
    scales = (hi - lo).clamp(min=1e-5) / 15
    zeros = (-torch.round(lo / scales)).clamp(0, 15)
    return scales, zeros


def quantize(weight: torch.Tensor, group_size: int, max_vals: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest with a zero point per group: weight [N, K] -> codes [N, K] uint8,
    zeros [K/G, N] uint8, scales [K/G, N] fp32. max_vals: [N, K/G] clip bounds, or None."""
    N, K = weight.shape
    w = weight.float().view(N, K // group_size, group_size)  # [N, groups, G]
    scales, zeros = _ranges(w, max_vals)
    codes = (torch.round(w / scales[..., None]) + zeros[..., None]).clamp(0, 15)
    return (codes.view(N, K).to(torch.uint8), zeros.t().contiguous().to(torch.uint8),
            scales.t().contiguous())


def fake_quantize(weight: torch.Tensor, group_size: int, max_vals: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """weight [N, K] -> what its 4-bit codes dequantize to (same shape and dtype): the error
    the AWQ searches minimize. scales stay fp32 here, as in AutoAWQ's search."""
    N, K = weight.shape
    w = weight.float().view(N, K // group_size, group_size)  # [N, groups, G]
    return fake_quantize_groups(w, max_vals).view(N, K).to(weight.dtype)


def fake_quantize_groups(w: torch.Tensor, max_vals: torch.Tensor | None = None) -> torch.Tensor:
    """w [N, groups, G] fp32 -> its dequantized 4-bit codes, same shape."""
    scales, zeros = _ranges(w, max_vals)
    s, z = scales[..., None], zeros[..., None]
    return ((torch.round(w / s) + z).clamp(0, 15) - z).mul_(s)
