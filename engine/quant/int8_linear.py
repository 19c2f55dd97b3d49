"""An 8-bit weight-only linear layer (the optional int8 lm_head): int8 codes, one scale per
output row, W[n, k] = q[n, k] * scale[n].

Kernel: torch's `_weight_int8pack_mm` (CPU and CUDA builds), else dequantize and matmul (the
reference). Graph capturable: static shapes, no host sync.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_ROWS = 8192  # rows rounded at once: a 150K-vocabulary lm_head never sits in fp32 whole


def _packed_mm_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """One tiny call, once per load: older or partial builds lack the op for a device."""
    try:
        x = torch.ones(1, 32, device=device, dtype=dtype)
        w = torch.ones(8, 32, device=device, dtype=torch.int8)
        torch._weight_int8pack_mm(x, w, torch.ones(8, device=device, dtype=dtype))
        return True
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


class Int8Linear(torch.nn.Module):
    """y = x W^T (+ bias); codes: [N, K] int8, scales: [N] in the compute dtype."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
                 kernel: str):
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.kernel = kernel
        self.codes = torch.nn.Parameter(codes, requires_grad=False)
        self.scales = torch.nn.Parameter(scales, requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"kernel={self.kernel}")

    @classmethod
    def quantize(cls, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
                 device: torch.device, kernel: str | None = None) -> Int8Linear:
        """Symmetric round-to-nearest per output row: scale = max |w| / 127."""
        codes = torch.empty(weight.shape, dtype=torch.int8, device=device)
        scales = torch.empty(weight.shape[0], dtype=torch.float32, device=device)
        for lo in range(0, weight.shape[0], CHUNK_ROWS):  # fp32 a chunk at a time
            w = weight[lo:lo + CHUNK_ROWS].to(device, torch.float32)
            s = w.abs().amax(1).clamp(min=1e-8) / 127  # [rows]
            codes[lo:lo + CHUNK_ROWS] = torch.round(w / s[:, None]).clamp(-127, 127)
            scales[lo:lo + CHUNK_ROWS] = s
        kernel = kernel or ("int8pack" if _packed_mm_runs(device, dtype) else "reference")
        return cls(codes, scales.to(dtype), None if bias is None else bias.to(device, dtype),
                   kernel)

    def dequantize(self) -> torch.Tensor:
        return self.codes.to(self.scales.dtype) * self.scales[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(self.scales.dtype)  # [M, K]
        if self.kernel == "int8pack":
            out = torch._weight_int8pack_mm(x2.contiguous(), self.codes, self.scales)
        else:
            out = F.linear(x2, self.dequantize())
        if self.bias is not None:
            out = out + self.bias
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)
