"""Watches the address the Server panel is set to: when a Hearth server started elsewhere (`hearth
serve` in a terminal, another window that keeps serving) answers there, its figures come once a
second. Each reading runs on a thread of its own so the window never waits on the network; the
thread touches no Qt object (a signal emitted from it while the panel is being destroyed
crashes the process): it leaves its answer in a slot the main thread's timer collects."""

from __future__ import annotations

import threading
import time

from PySide6.QtCore import QObject, QTimer, Signal

from engine.remote.server_figures import ServerFigures, read_server

POLL_MS = 1000
COLLECT_MS = 100  # how often the main thread looks for a finished reading


class _Mailbox:
    """What a reading thread shares with the main thread: a plain object, never a Qt one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reading = False
        self.answer: tuple[str, ServerFigures | None, float] | None = None


class ServerWatch(QObject):
    sig_figures = Signal(object, float)  # ServerFigures, tokens/s since the last reading
    sig_gone = Signal()  # nothing (or no Hearth server) answers there any more

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.url, self.api_key = "", None
        self.last: tuple[float, int] | None = None  # (monotonic time, tokens) of the last reading
        self.is_present = False
        self._box = _Mailbox()
        self._next_read = 0.0
        self.timer = QTimer(self)
        self.timer.setInterval(COLLECT_MS)
        self.timer.timeout.connect(self._tick)

    def watch(self, url: str, api_key: str | None) -> None:
        """Watch `url` (http://host:port) from now on, reading at once."""
        if url != self.url:
            self.last, self.is_present = None, False
        self.url, self.api_key = url, api_key
        self._next_read = 0.0
        self.timer.start()
        self._tick()

    def pause(self) -> None:
        """No more readings until the next watch(), what was seen kept."""
        self.timer.stop()

    def stop(self) -> None:
        self.timer.stop()
        if self.is_present:
            self.is_present = False
            self.sig_gone.emit()
        self.url, self.last = "", None

    def _tick(self) -> None:
        box = self._box
        with box.lock:
            answer, box.answer = box.answer, None
            busy = box.reading
        if answer is not None:
            self._on_answer(*answer)
        if busy or not self.url or time.monotonic() < self._next_read:
            return
        self._next_read = time.monotonic() + POLL_MS / 1000
        url, key = self.url, self.api_key
        with box.lock:
            box.reading = True

        def read() -> None:  # no Qt here, and nothing of the panel's but the mailbox
            figures = read_server(url, key)
            with box.lock:
                box.answer, box.reading = (url, figures, time.monotonic()), False

        threading.Thread(target=read, name="hearth-server-watch", daemon=True).start()

    def _on_answer(self, url: str, figures: ServerFigures | None, when: float) -> None:
        if url != self.url:  # the address changed while this was asked
            return
        if figures is None:
            self.last = None
            if self.is_present:
                self.is_present = False
                self.sig_gone.emit()
            return
        rate = 0.0
        if self.last is not None and when > self.last[0]:
            rate = max(0, figures.tokens - self.last[1]) / (when - self.last[0])
        self.last, self.is_present = (when, figures.tokens), True
        self.sig_figures.emit(figures, rate)
