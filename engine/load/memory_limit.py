"""Emulating a smaller card: torch's allocator capped at a size minus the CUDA context, and the
cap lifted again (it is per process and outlives the load that set it)."""

from __future__ import annotations

import torch

from engine.events import BadRequest


def apply_memory_limit(device: torch.device, gib: float | None) -> None:
    """Emulate a smaller card: cap torch's allocator at that size minus the CUDA context.

    None lifts an earlier load's cap: the fraction is per process and outlives its load."""
    if device.type != "cuda":
        return
    if gib is None:
        return clear_memory_limit(device)
    device = _indexed(device)
    free, total = torch.cuda.mem_get_info(device)  # creates the context we must subtract
    from engine.platform.telemetry import nvml_process_used_bytes

    context_bytes = cuda_context_bytes(total, free, torch.cuda.memory_reserved(device),
                                       nvml_process_used_bytes(device))
    budget = gib * 2**30 - max(context_bytes, 0)
    if budget <= 0:
        raise BadRequest(f"a {gib} GiB memory limit leaves nothing after the CUDA context")
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), device)


def clear_memory_limit(device: torch.device) -> None:
    """The whole card for torch's allocator again (an unload, or a load without a limit)."""
    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(1.0, _indexed(device))


def _indexed(device: torch.device) -> torch.device:
    # set_per_process_memory_fraction wants an index: "cuda" alone means the current device
    return torch.device("cuda", torch.cuda.current_device() if device.index is None
                        else device.index)


def cuda_context_bytes(total: int, free: int, reserved: int, process_used: int | None) -> int:
    """This process's memory outside torch's allocator (the CUDA context, loaded kernels).

    NVML's per-process figure where it answers: the device-wide free memory also counts every
    other process on the card (a desktop's display server, other engines' processes), which
    would shrink an emulated card to nothing.
    """
    if process_used is not None:
        return process_used - reserved
    return total - free - reserved
