"""Whether a decode step's norms and SiLU * up run as one Triton launch each (fused_ops_kernel.py)
instead of PyTorch's eight and two small kernels: where Triton runs on a GPU, unless
`HEARTH_FUSED_OPS=off`, or `--compile` fuses them already. Checked at load against the PyTorch
pieces on this model's own norm weights; a launch that fails or disagrees leaves them as they were.
"""

from __future__ import annotations

import os

import torch

from engine import attention_backend

ENV = "HEARTH_FUSED_OPS"  # auto (default) | off
TOLERANCE = 1e-2  # relative: the two round alike step for step (the interpreter tests see 0 to
# 1e-7 in fp32, 0 to 7e-6 in fp16); a wrong row or column moves whole values


def wanted(device: torch.device) -> bool:
    setting = os.environ.get(ENV, "auto")
    if setting not in ("auto", "off"):
        raise ValueError(f"{ENV} must be auto or off, not {setting!r}")
    return setting == "auto" and device.type == "cuda" and attention_backend.triton_available()


def enable(step) -> str | None:
    """Swap a FamilyStep's (or TPStep's) rms, add_rms and silu_mul for the Triton ones after
    comparing the two on rows of its hidden size (one token and five), its first layer's norm
    weight, and an MLP input of its width. -> a note for the load event when they stay as they
    were, else None."""
    w = step.layers[0].ln_post
    hidden, device, dtype = w.shape[0], w.device, w.dtype
    width = _mlp_width(step)
    try:
        from engine import fused_ops_kernel as K

        g = torch.Generator(device="cpu").manual_seed(0)
        worst = 0.0
        for T in (1, 5):
            x, d = (torch.randn(1, T, hidden, generator=g).to(device, dtype) for _ in range(2))
            gu = torch.randn(1, T, 2 * width, generator=g).to(device, dtype)
            pairs = [(K.rms(x, w, step.eps), step.rms(x, w)),
                     *zip(K.add_rms(x, d, w, step.eps), step.add_rms(x, d, w), strict=True),
                     (K.silu_mul(gu), step.silu_mul(gu))]
            for got, want in pairs:
                want = want.float()
                worst = max(worst, ((got.float() - want).norm() / want.norm()).item())
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # a failed launch reports here
    except Exception as e:  # whatever broke, the PyTorch pieces still compute the same
        return (f"the fused norm and SiLU kernels failed here ({type(e).__name__}: "
                f"{str(e)[:200]}); the step keeps PyTorch's")
    if not worst < TOLERANCE:  # (NaN included)
        return (f"the fused norm and SiLU kernels disagreed with PyTorch's here (relative error "
                f"{worst:.1e}); the step keeps PyTorch's")
    eps = step.eps
    step.fns.update(rms=lambda x, w: K.rms(x, w, eps),
                    add_rms=lambda x, delta, w: K.add_rms(x, delta, w, eps),
                    silu_mul=K.silu_mul)
    return None


def _mlp_width(step) -> int:
    """The MLP's intermediate size (one rank's share under tensor parallelism): the down
    projection's input features."""
    down = step.layers[0].down
    if hasattr(down, "in_features"):  # nn.Linear, bitsandbytes' and the int4 layers
        return down.in_features
    weight = down if isinstance(down, torch.Tensor) else down.weight  # plain, RowParallel
    return weight.shape[1]
