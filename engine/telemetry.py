"""Memory readings for stats: NVML's per-process figure where a driver answers, torch's otherwise.

NVML is read rather than `torch.cuda.mem_get_info()`, which would create a CUDA context.
"""

from __future__ import annotations

import os

import torch


def vram_used_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    try:
        from engine.gpu import process_used_bytes

        used = process_used_bytes(os.getpid(), device.index or 0)
    except Exception:  # no NVML: fall back to what torch itself holds
        used = None
    return int(used) if used is not None else int(torch.cuda.memory_reserved(device))
