"""Which kernels failed their load check, for one session (its cache holds it): a kernel that
broke on one session's cache kind is read around there, not in every session of the process."""

from __future__ import annotations


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
