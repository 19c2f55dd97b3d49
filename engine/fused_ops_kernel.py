"""The small pieces between a decode step's linear layers, one Triton launch each: the residual
add with the RMSNorm after it, the RMSNorm alone, and SiLU(gate) * up.

In PyTorch ops (layers.FamilyStep) an RMSNorm is eight kernels (the fp32 copy, square, mean,
epsilon, rsqrt, product, cast back, weight) and SiLU * up two; a Llama/Qwen layer runs two norms
and one MLP, about 18 small kernels a layer that each cost a few microseconds of a captured step
whatever their size (issue 12's arithmetic in BENCHMARKS.md: about 2.6 ms of a 7B bf16 step did
not scale with the weights). torch.compile fuses them too (`--compile`), at seconds of load time.

The rounding is PyTorch's, step for step: the sum in the input dtype, the norm in fp32 and cast
back before the weight's product in the input dtype, SiLU rounded before its product; only the
order of the mean's additions differs. One program per row of the hidden size, which fits one
tile (up to 16K columns). Imported only where Triton runs (CUDA, or TRITON_INTERPRET=1 in tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_COLUMNS = 16384  # one row in one tile: Llama-3-70B's 8,192 and some headroom


@triton.jit
def _add_rms(X, DELTA, W, SUM, OUT, eps, N: tl.constexpr, BLOCK: tl.constexpr,
             HAS_DELTA: tl.constexpr):
    """Row r of X [R, N] (+ DELTA [R, N] -> SUM): OUT = W * (x * rsqrt(mean(x^2) + eps))."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(X + row * N + cols, mask=ok, other=0.0)
    if HAS_DELTA:  # rounded to the input dtype, as x + delta is in PyTorch
        x = (x.to(tl.float32) + tl.load(DELTA + row * N + cols, mask=ok, other=0.0)
             .to(tl.float32)).to(X.dtype.element_ty)
        tl.store(SUM + row * N + cols, x, mask=ok)
    x32 = x.to(tl.float32)
    r = tl.math.rsqrt(tl.sum(x32 * x32, 0) / N + eps)
    y = (x32 * r).to(X.dtype.element_ty).to(tl.float32)  # cast back, then the weight's product
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + row * N + cols, (w * y).to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul(GU, OUT, N: tl.constexpr, BLOCK: tl.constexpr):
    """Row r of GU [R, 2N] = [gate, up] -> OUT [R, N] = SiLU(gate) * up, SiLU rounded first."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    g = tl.load(GU + row * 2 * N + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(GU + row * 2 * N + N + cols, mask=ok, other=0.0).to(tl.float32)
    silu = tl.math.div_rn(g, 1.0 + tl.exp(-g)).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * N + cols, (silu * u).to(OUT.dtype.element_ty), mask=ok)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _launch_rms(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    N = x.shape[-1]
    xr = _rows(x.contiguous())
    out = torch.empty_like(xr, dtype=torch.promote_types(w.dtype, x.dtype))
    total = torch.empty_like(xr) if delta is not None else xr
    dr = _rows(delta.contiguous()) if delta is not None else xr
    block = triton.next_power_of_2(N)
    _add_rms[(xr.shape[0],)](xr, dr, w, total, out, float(eps), N=N, BLOCK=block,
                             HAS_DELTA=delta is not None, num_warps=8 if block >= 4096 else 4)
    return total.view(x.shape), out.view(x.shape)


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [..., N] -> w * RMSNorm(x), as FamilyStep.rms."""
    return _launch_rms(x, None, w, eps)[1]


def add_rms(x: torch.Tensor, delta: torch.Tensor, w: torch.Tensor,
            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (x + delta, w * RMSNorm(x + delta)), as FamilyStep.add_rms."""
    return _launch_rms(x, delta, w, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2N] = [gate, up] -> [..., N] = SiLU(gate) * up, as FamilyStep.silu_mul."""
    N = gate_up.shape[-1] // 2
    gu = _rows(gate_up.contiguous())
    out = torch.empty((gu.shape[0], N), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(N))
    _silu_mul[(gu.shape[0], triton.cdiv(N, block))](gu, out, N=N, BLOCK=block, num_warps=4)
    return out.view(*gate_up.shape[:-1], N)
