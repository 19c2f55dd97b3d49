"""The environment of every process the engine or the app starts (the worker, tensor-parallel
followers, the app): the parent's, with NVLink multicast switched off. No torch here: the app
imports it to start the worker.
"""

from __future__ import annotations

import os
from pathlib import Path

# NVLink multicast stays off in NCCL, PyTorch and NVSHMEM: on a shared multi-GPU host a program
# that uses it can put every GPU out of service (the device machines' KINDS.md)
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
REPO_ROOT = str(Path(__file__).resolve().parents[1])


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ plus `extra` plus NO_MULTICAST (which wins over both), with the repository on
    PYTHONPATH so the child finds `engine` from any folder."""
    env = {**os.environ, **(extra or {}), **NO_MULTICAST}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    return env
