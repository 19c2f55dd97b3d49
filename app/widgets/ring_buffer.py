"""A fixed-size time series for live charts: preallocated numpy arrays, the oldest sample
overwritten first, so appending never allocates (the charts redraw from it at ~10 Hz)."""

from __future__ import annotations

import numpy as np


class RingBuffer:
    def __init__(self, capacity: int, names: tuple[str, ...]) -> None:
        self.capacity = capacity
        self.names = names
        self._t = np.full(capacity, np.nan)
        self._values = np.full((len(names), capacity), np.nan)  # [series, sample]
        self._next = 0
        self.size = 0

    def append(self, t: float, *values: float) -> None:
        i = self._next
        self._t[i] = t
        self._values[:, i] = values  # None becomes nan: a gap in the curve
        self._next = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def times(self) -> np.ndarray:
        return self._ordered(self._t)

    def series(self, name: str) -> np.ndarray:
        return self._ordered(self._values[self.names.index(name)])

    def last_time(self) -> float:
        if not self.size:
            return float("nan")
        return float(self._t[(self._next - 1) % self.capacity])

    def last(self, name: str) -> float:
        if not self.size:
            return float("nan")
        return float(self._values[self.names.index(name), (self._next - 1) % self.capacity])

    def _ordered(self, row: np.ndarray) -> np.ndarray:
        """Oldest first; a view until the buffer has wrapped, then one copy."""
        if self.size < self.capacity:
            return row[: self.size]
        return np.concatenate((row[self._next:], row[: self._next]))
