"""NVML reads off the GUI thread: the GPU report at start-up and, while a worker runs, its VRAM
once a second. One background thread does the reads; a GUI-thread timer collects the results,
so no signal ever crosses threads."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from PySide6.QtCore import QObject, QTimer, Signal

from app.models import fit_check

POLL_INTERVAL_MS = 100
SAMPLE_INTERVAL_S = 1.0


@dataclass(frozen=True)
class VramSample:
    t: float  # time.monotonic()
    device_used_bytes: float | None  # the whole card, every process
    process_used_bytes: float | None  # the worker alone; None where NVML cannot say


class GpuProbe(QObject):
    sig_report = Signal(object)
    """A GpuReport (possibly with no GPU, and the reason)."""
    sig_vram_sample = Signal(object)
    """A VramSample of the watched worker process."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.report = None
        self.pid = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hearth-nvml")
        self._report_future: Future | None = None
        self._sample_future: Future | None = None
        self._last_sample_t = 0.0
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_INTERVAL_MS)
        self._timer.timeout.connect(self._on_timer_timeout)

    def detect(self) -> None:
        """Read the GPUs in the background; sig_report follows."""
        if self._report_future is None:
            self._report_future = self._executor.submit(fit_check.detect_gpus)
            self._timer.start()

    def watch(self, pid: int) -> None:
        """Sample this worker's VRAM once a second (0 stops)."""
        self.pid = pid
        if pid:
            self._timer.start()

    def close(self) -> None:
        self._timer.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _on_timer_timeout(self) -> None:
        if self._report_future is not None and self._report_future.done():
            self.report = self._report_future.result()
            self._report_future = None
            self.sig_report.emit(self.report)
        if self._sample_future is not None and self._sample_future.done():
            sample, self._sample_future = self._sample_future.result(), None
            if sample is not None:
                self.sig_vram_sample.emit(sample)
        now = time.monotonic()
        gpu = fit_check.first_gpu(self.report)
        if self.pid and gpu is not None and self._sample_future is None and (
                now - self._last_sample_t >= SAMPLE_INTERVAL_S):
            self._last_sample_t = now
            self._sample_future = self._executor.submit(_sample, self.pid, gpu.index)
        has_nothing_to_sample = not self.pid or (self.report is not None and gpu is None)
        if has_nothing_to_sample and self._report_future is None and self._sample_future is None:
            self._timer.stop()


def _sample(pid: int, index: int) -> VramSample | None:
    report = fit_check.detect_gpus()
    device = next((g.used_bytes for g in report.gpus if g.index == index), None)
    process = fit_check.process_used_bytes(pid, index)
    return VramSample(time.monotonic(), _float(device), _float(process))


def _float(value: int | None) -> float | None:
    return float(value) if value is not None else None
