"""The environment of every process the engine or the app starts (the worker, tensor-parallel
followers, the app): the parent's, with NVLink multicast switched off, the CPU thread policy
(one thread per physical core) and torch's CUDA allocator settings. No torch here: the app
imports it to start the worker.
"""

from __future__ import annotations

import os
from pathlib import Path

# NVLink multicast stays off in NCCL, PyTorch and NVSHMEM: on a shared multi-GPU host a program
# that uses it can put every GPU out of service (the device machines' KINDS.md)
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
# torch's CUDA allocator, unless the user chose its settings: expandable segments can hand freed
# pages back (fusing q/k/v and gate/up frees the unfused weights' blocks), and the VRAM planner
# was validated with them (docs/benchmark-log.md)
ALLOCATOR = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
ALLOCATOR_NAMES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # either is the user's choice
REPO_ROOT = str(Path(__file__).resolve().parents[2])
_CPU_SYSFS = Path("/sys/devices/system/cpu")


def physical_cores(cpus: set[int] | None = None, sysfs: Path = _CPU_SYSFS) -> int:
    """The physical cores among the CPUs this process may run on (hyper-threads share one):
    Linux's topology files, else the count of usable CPUs."""
    if cpus is None:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(
            range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topology = sysfs / f"cpu{cpu}" / "topology"
        try:
            cores.add((topology.joinpath("physical_package_id").read_text().strip(),
                       topology.joinpath("core_id").read_text().strip()))
        except OSError:
            return max(1, len(cpus))  # no topology (not Linux, a sandbox): one thread per CPU
    return max(1, len(cores))


def thread_policy(environ=os.environ) -> dict[str, str]:
    """The OpenMP settings torch's CPU kernels should start with, for those the user left unset:
    one thread per physical core (a hyper-thread twin shares the core's vector units).

    The wait policy stays OpenMP's own (a spin before a waiting thread sleeps): passive waiting
    costs a quiet machine about 14% (docs/benchmark-log.md). Spinning threads starve a step while
    another process is busy on a core; there the session runs fewer threads
    (platform/cpu_threads.py), and a lone thread never waits for another.
    """
    policy = {"OMP_NUM_THREADS": str(physical_cores())}
    return {k: v for k, v in policy.items() if not environ.get(k)}


def apply_thread_policy() -> None:
    """Put thread_policy() into this process's environment. It takes effect where torch is not
    imported yet (OpenMP reads it when torch loads it) and in every child started after."""
    os.environ.update(thread_policy())


def allocator_policy(environ=os.environ) -> dict[str, str]:
    """ALLOCATOR, where the user set neither of torch's allocator variables."""
    return {} if any(environ.get(k) for k in ALLOCATOR_NAMES) else dict(ALLOCATOR)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ plus the thread policy and allocator settings plus `extra` plus NO_MULTICAST
    (which wins over all), with the repository on PYTHONPATH so the child finds `engine` from
    any folder."""
    env = {**thread_policy(), **allocator_policy(), **os.environ, **(extra or {}),
           **NO_MULTICAST}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    return env
