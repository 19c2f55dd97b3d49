"""A block table on the device, mirrored on the host: [n] int32 block ids, entries past a
sequence's blocks naming a scratch block. Allocated once and written in place, from the host, only
where an entry changed (captured CUDA graphs hold its address): a few entries one by one (a fill
kernel each, no host sync on the decode path), more in one copy."""

from __future__ import annotations

from collections.abc import Callable

import torch

FEW_CHANGES = 8  # table entries written one by one (fill_, no sync); more: one copy


class DeviceTable:
    def __init__(self, n: int, scratch: int, device: torch.device | str):
        self.scratch = scratch
        self.tensor = torch.full((n,), scratch, dtype=torch.int32, device=device)
        self.mirror = [scratch] * n  # what the device tensor holds
        self._num_named = 0  # entries from here on name the scratch block

    def sync(self, entry: Callable[[int], int], num_named: int, first: int = 0) -> None:
        """Entries first..num_named-1 become entry(i); those past num_named, the scratch block
        (first 0: every entry is checked; else only first..num_named-1, which grew)."""
        end = max(num_named, self._num_named) if first == 0 else num_named
        want = lambda i: entry(i) if i < num_named else self.scratch  # noqa: E731
        changed = [(i, w) for i in range(first, end) if self.mirror[i] != (w := want(i))]
        self._num_named = num_named
        for i, w in changed:
            self.mirror[i] = w
        if len(changed) <= FEW_CHANGES:
            for i, w in changed:
                self.tensor[i:i + 1].fill_(w)
        else:
            self.tensor.copy_(torch.tensor(self.mirror, dtype=torch.int32))
