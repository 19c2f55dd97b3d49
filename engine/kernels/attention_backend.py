"""Which path reads a KV cache: the Triton kernel, SDPA over a gathered copy, or the PyTorch
reference (attention/paged.py holds a class for each), chosen per device and KV dtype from the
session's setting (config.Backends.decode_attention), what this machine has and the
session's kernel health (K/V writes are quantized by one Triton launch where the kernel reads
the cache: KVCache.fused_writes). Also a session's KernelHealth: which
kernels failed their load check (its cache holds it), so a kernel that broke on one session's
cache kind is read around there, not in every session of the process.

A leaf (torch, the KV dtype registry and the settings only): the cache, the arena, the
kernels and the attention paths all ask it, and it asks none of them.
"""

from __future__ import annotations

import functools
import os
import shutil

import torch

from engine.config import overrides
from engine.config.backends import DECODE_ATTENTION as SETTINGS
from engine.formats import kv_dtypes


class KernelHealth:
    """(kernel, device, KV dtype) entries that failed: e.g. ("decode_attention", "cuda:0",
    "int8")."""

    def __init__(self):
        self.failed: set[tuple[str, str, str]] = set()

    def mark_failed(self, kernel: str, device, kv_dtype: str) -> None:
        self.failed.add((kernel, str(device), kv_dtype))

    def is_failed(self, kernel: str, device, kv_dtype: str) -> bool:
        return (kernel, str(device), kv_dtype) in self.failed

    def as_list(self) -> list[str]:
        return sorted(f"{k} on {d} for {kv}" for k, d, kv in self.failed)


# auto: every cache through the Triton kernel on a GPU where Triton runs: a paged arena cannot be
# read in place by SDPA, and even a bf16 cache decodes faster through the kernel, by far at long
# contexts (docs/benchmark-log.md: SDPA's masked grouped-query path reads slowly). Elsewhere
# int8/fp8 through the PyTorch reference and 16-bit caches through SDPA over a gathered
# contiguous copy (the numerics of prefill and of transformers' modules, so the fused step stays
# token-identical to them on CPU). triton: the same as auto. sdpa: SDPA over a gathered copy for
# 16-bit caches, the reference for quantized ones. reference: the PyTorch split algorithm for
# every cache (if Triton misbehaves somewhere)
ENV = overrides.DECODE_ATTENTION  # the developer override of the setting
KERNEL = "decode_attention"  # its name in a session's KernelHealth
KERNEL_READS = "triton"  # the name of the path through it


@functools.cache
def triton_available() -> bool:
    """Triton imports and can build its launcher: it needs a host C compiler (CPU torch has no
    Triton at all)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return any(shutil.which(c) for c in (os.environ.get("CC") or "cc", "gcc", "clang"))


def backend(device: torch.device | str, kv_dtype: str, setting: str = "auto",
            health: KernelHealth | None = None) -> str:
    """How decode steps read a cache of `kv_dtype` on `device` under `setting`: "sdpa" (16-bit
    only), "triton" or "reference"; where `health` saw the kernel fail, not "triton"."""
    how = choose(str(device), kv_dtype, setting)
    if how == "triton" and health is not None and health.is_failed(KERNEL, device, kv_dtype):
        return "reference" if kv_dtypes.get(kv_dtype).scaled else "sdpa"
    return how


@functools.cache
def choose(device: str, kv_dtype: str, setting: str) -> str:
    if setting not in SETTINGS:
        raise ValueError(f"{ENV} must be one of {', '.join(SETTINGS)}, not {setting!r}")
    quantized = kv_dtypes.get(kv_dtype).scaled
    if setting == "reference" or (setting == "sdpa" and quantized):
        return "reference"
    if setting == "sdpa":
        return "sdpa"
    on_gpu = torch.device(device).type == "cuda"
    # Triton converts fp8 e4m3 in hardware from compute capability 8.9 (Ada, Hopper) on
    if on_gpu and triton_available() and kv_dtypes.runs_natively(
            kv_dtype, torch.cuda.get_device_capability(device)):
        return "triton"
    return "reference" if quantized else "sdpa"


def kernel_reads(device: torch.device, kv_dtype: str, setting: str = "auto",
                 health: KernelHealth | None = None) -> bool:
    """Whether the Triton kernel reads caches of `kv_dtype` on `device` (it then runs too)."""
    return backend(device, kv_dtype, setting, health) == KERNEL_READS
