"""The live charts' time axis: seconds ago over a sliding window, 0 (now) at the right edge.
Samples keep their own times; the axis writes each tick as how long before now it was."""

from __future__ import annotations

from collections.abc import Callable

import pyqtgraph as pg

WINDOWS_S = {"Last minute": 60, "Last 5 minutes": 300}
# a pause longer than this between two samples breaks the line instead of bridging it
MAX_GAP_S = 3.0
TICK_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800)
MAX_TICKS = 7


class SecondsAgoAxis(pg.AxisItem):
    """x is a sample's time; a tick at x is drawn as `now() - x` on an axis labelled "seconds
    ago"."""

    def __init__(self, now: Callable[[], float]) -> None:
        super().__init__("bottom")
        self.now = now
        self.setLabel("seconds ago")
        self.enableAutoSIPrefix(False)

    def tickValues(self, minVal, maxVal, size):  # noqa: N802, N803 (pyqtgraph override)
        """Ticks at round numbers of seconds ago (0, 10, 20 …), whatever the time now."""
        now, span = self.now(), maxVal - minVal
        if span <= 0:
            return []
        step = next((s for s in TICK_STEPS_S if span / s <= MAX_TICKS), TICK_STEPS_S[-1])
        ticks, ago = [], 0.0
        while now - ago >= minVal:
            if now - ago <= maxVal:
                ticks.append(now - ago)
            ago += step
        return [(step, ticks)]

    def tickStrings(self, values, scale, spacing):  # noqa: N802 (pyqtgraph override)
        now = self.now()
        return [f"{max(now - v * scale, 0):.0f}" for v in values]
