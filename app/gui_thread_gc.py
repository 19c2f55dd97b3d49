"""Python's cycle collector, run on the GUI thread only.

The automatic collector runs on whichever thread happens to allocate when a generation's count
crosses its threshold. In this app that can be a download, endpoint or server-watch thread, and
a garbage cycle that holds a Qt object (a closure over a widget, a signal connected to a bound
method) then has that object destroyed off the GUI thread while the GUI thread processes events:
Qt crashes. pyqtgraph documents the same hazard. So while a GuiThreadGC lives, automatic
collection is off and a timer on the GUI thread collects by the same thresholds.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

INTERVAL_MS = 500  # often enough that garbage cycles never pile up between two ticks


class GuiThreadGC(QObject):
    def __init__(self, parent: QObject | None = None, interval_ms: int = INTERVAL_MS):
        super().__init__(parent)
        self._thresholds = gc.get_threshold()
        self._was_enabled = gc.isenabled()
        gc.disable()
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.collect_due)
        self._timer.start(interval_ms)

    def collect_due(self) -> int:
        """Collect the oldest generation whose count is past its threshold; the number of
        unreachable objects found (0 when none was due)."""
        counts = gc.get_count()
        due = -1
        for generation, (count, threshold) in enumerate(zip(counts, self._thresholds, strict=True)):
            if threshold and count > threshold:
                due = generation
            else:
                break  # an older generation only counts collections of the younger one
        return gc.collect(due) if due >= 0 else 0

    def stop(self) -> None:
        """Automatic collection back as it was; what is garbage now is collected here."""
        self._timer.stop()
        gc.collect()
        if self._was_enabled:
            gc.enable()
