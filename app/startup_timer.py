"""How long the window took to appear: from a clock read at the top of app/__main__.py, before
its imports, to the window's first paint. The app logs it at every start; `python -m app
--startup-check` prints it and quits (the start-up test and benchmark). The interpreter's own
start (~20 ms) comes before the clock: time the whole process from outside for that."""

from __future__ import annotations

import time

from PySide6.QtCore import QEvent, QObject, Signal


class StartupTimer(QObject):
    sig_shown = Signal(float)
    """The watched window painted for the first time: seconds since `t0`."""

    def __init__(self, window, t0: float, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.t0 = t0  # a time.perf_counter() reading
        self.seconds: float | None = None
        self._window = window
        window.installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt override)
        if watched is self._window and event.type() == QEvent.Type.Paint and self.seconds is None:
            self.seconds = time.perf_counter() - self.t0
            self._window.removeEventFilter(self)
            self.sig_shown.emit(self.seconds)
        return False
