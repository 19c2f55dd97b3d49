"""Memory readings for stats: NVML's per-process figure where a driver answers, torch's otherwise.

NVML is read rather than `torch.cuda.mem_get_info()`, which would create a CUDA context.
"""

from __future__ import annotations

import os

import torch


def vram_used_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    used = nvml_process_used_bytes(device)
    return int(used) if used is not None else int(torch.cuda.memory_reserved(device))


def nvml_process_used_bytes(device: torch.device) -> int | None:
    """NVML's figure for this process on `device`, or None where NVML cannot say."""
    try:
        from engine.platform.gpu import process_used_bytes

        return process_used_bytes(os.getpid(), device.index or 0)
    except Exception:  # no driver library, no permission: the caller falls back
        return None
