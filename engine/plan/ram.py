"""The computer's memory free for a model on the CPU, as the kernel counts it: what `hearth plan`
and the model picker fit a model against without a GPU, and what a CPU load checks its KV cache
against. No torch: the app imports it."""

from __future__ import annotations

import os


def available_ram_bytes() -> int:
    """What the kernel says a process can still take (MemAvailable), else all physical RAM."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # Windows has no sysconf
        return 0
