"""The engine's own int4 layers after a load: bitsandbytes' NF4 layers on a GPU swapped for
quant/nf4_linear.py's, and every int4 layer's prefill products set as the session's Backends say.
Not the layers themselves (quant/)."""

from __future__ import annotations

import torch

from engine.config.backends import Backends


def own(model, quant: str, device: torch.device, backends: Backends) -> None:
    """bitsandbytes' NF4 layers on a GPU swapped for the engine's (quant/nf4_linear.py: the same
    codes, run by the int4 kernels' codebook variant, faster than bitsandbytes' layers:
    BENCHMARKS.md); a session's int4 kernel other than "mma" keeps bitsandbytes' layers. Then
    every int4 layer's prefill products as the session's int4_prefill says."""
    if quant == "nf4" and device.type == "cuda" and backends.int4_kernel in (None, "mma"):
        from engine.quant import nf4_linear

        nf4_linear.convert(model)
    if backends.int4_prefill != "fused":
        from engine.quant.int4_linear import Int4Linear

        for m in model.modules():
            if isinstance(m, Int4Linear):
                m.fused_prefill = False
