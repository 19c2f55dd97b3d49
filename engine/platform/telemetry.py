"""Memory readings for stats: NVML's per-process figure where a driver answers, torch's otherwise.

NVML is read rather than `torch.cuda.mem_get_info()`, which would create a CUDA context.
"""

from __future__ import annotations

import os
import time

import torch

READ_EVERY_S = 0.5  # a batch's generations each report stats 4 times a second: NVML (an init,
# a process list, a shutdown: milliseconds on the engine thread) is asked at most this often
_last: dict[torch.device, tuple[float, int]] = {}
_clock = time.monotonic


def vram_used_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    now = _clock()
    last = _last.get(device)
    if last is not None and now - last[0] < READ_EVERY_S:
        return last[1]
    used = nvml_process_used_bytes(device)
    value = int(used) if used is not None else int(torch.cuda.memory_reserved(device))
    _last[device] = (now, value)
    return value


def nvml_process_used_bytes(device: torch.device) -> int | None:
    """NVML's figure for this process on `device`, or None where NVML cannot say."""
    try:
        from engine.platform.gpu import process_used_bytes

        return process_used_bytes(os.getpid(), device.index or 0)
    except Exception:  # no driver library, no permission: the caller falls back
        return None
