"""torch's CUDA allocator settings for this process, set by a load before CUDA starts (torch
reads them when its allocator first runs, not at import): the worker and the tensor-parallel
followers have them from child_env already; `hearth run` and the benchmarks get them here."""

from __future__ import annotations

import os

import torch

from engine.platform.child_env import ALLOCATOR_NAMES, allocator_policy


def configure() -> str:
    """Put child_env's allocator settings into this process's environment where the user set
    none and CUDA has not started yet -> the settings in force ("" where unknown: CUDA was
    started before, with whatever it read then)."""
    if not torch.cuda.is_initialized():
        os.environ.update(allocator_policy())
    return next((f"{k}={os.environ[k]}" for k in ALLOCATOR_NAMES if os.environ.get(k)), "")
