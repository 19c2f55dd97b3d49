"""A cancel flag that can also unblock a read: whoever streams registers how to close its
connection, so stopping a stalled endpoint takes effect at once, not at the next chunk."""

from __future__ import annotations

import threading
from collections.abc import Callable


class CancelToken:
    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._closers: list[Callable[[], None]] = []

    @property
    def is_cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        """Safe from any thread, any number of times."""
        with self._lock:
            self._event.set()
            closers, self._closers = self._closers, []
        for close in closers:
            close()

    def on_cancel(self, close: Callable[[], None]) -> None:
        """Run `close` at cancel(), or now if that already happened."""
        with self._lock:
            if not self._event.is_set():
                self._closers.append(close)
                return
        close()
