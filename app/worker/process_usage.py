"""The worker's memory (RSS) and CPU use, read by the app from its PID: /proc/<pid>/stat and
statm on Linux (no psutil); elsewhere None, and the panel says it cannot chart them. A QTimer
samples once a second, off no thread: two small file reads."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

SAMPLE_INTERVAL_MS = 1000
PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessSample:
    t: float  # time.monotonic()
    rss_bytes: float
    cpu_percent: float  # of one core: 200 is two cores busy; nan for the first sample


def read_usage(pid: int, proc: Path = PROC) -> tuple[int, float] | None:
    """(RSS bytes, CPU seconds used so far) of a process, or None where /proc has no such
    process (it ended, or this is not Linux)."""
    try:
        statm = (proc / str(pid) / "statm").read_text().split()
        stat = (proc / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # the command name in (...) may hold spaces and parentheses: fields follow the last ")"
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        ticks = int(fields[11]) + int(fields[12])  # utime + stime: fields 14 and 15 of stat
        rss_pages = int(statm[1])
    except (IndexError, ValueError):
        return None
    return rss_pages * os.sysconf("SC_PAGE_SIZE"), ticks / os.sysconf("SC_CLK_TCK")


def is_supported() -> bool:
    return PROC.is_dir() and hasattr(os, "sysconf")


class ProcessSampler(QObject):
    sig_sample = Signal(object)
    """A ProcessSample of the watched process."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.pid = 0
        self._last: tuple[float, float] | None = None  # (monotonic time, CPU seconds)
        self._timer = QTimer(self)
        self._timer.setInterval(SAMPLE_INTERVAL_MS)
        self._timer.timeout.connect(self.sample)

    def watch(self, pid: int) -> None:
        """Sample `pid` from now on; 0 stops."""
        if pid == self.pid:
            return
        self.pid, self._last = pid, None
        if pid and is_supported():
            self._timer.start()
            self.sample()
        else:
            self._timer.stop()

    def sample(self) -> None:
        usage = read_usage(self.pid) if self.pid else None
        if usage is None:
            return
        rss, cpu_s = usage
        now = time.monotonic()
        percent = float("nan")
        if self._last is not None and now > self._last[0]:
            percent = 100 * (cpu_s - self._last[1]) / (now - self._last[0])
        self._last = (now, cpu_s)
        self.sig_sample.emit(ProcessSample(now, float(rss), percent))
