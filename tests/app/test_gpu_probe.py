"""GpuProbe reads NVML off the GUI thread and hands results over on it."""

from __future__ import annotations

import threading

from app.models import fit_check
from app.worker.gpu_probe import GpuProbe
from engine.platform.gpu import GpuInfo, GpuReport

GiB = 1 << 30
REPORT = GpuReport((GpuInfo(0, "Fake", "GPU-fake", 24 * GiB, 20 * GiB, 4 * GiB, (8, 9),
                            "560.35", True, True),))


def test_report_and_process_samples_arrive_on_the_gui_thread(qtbot, monkeypatch):
    threads = []

    def detect_gpus():
        threads.append(threading.current_thread())
        return REPORT

    monkeypatch.setattr(fit_check, "detect_gpus", detect_gpus)
    monkeypatch.setattr(fit_check, "process_used_bytes", lambda pid, index=0: 3 * GiB)
    probe = GpuProbe()
    with qtbot.waitSignal(probe.sig_report, timeout=5_000) as blocker:
        probe.detect()
    assert blocker.args[0] == REPORT
    assert threads[0] is not threading.main_thread()  # NVML is read off the GUI thread
    with qtbot.waitSignal(probe.sig_vram_sample, timeout=5_000) as blocker:
        probe.watch(1234)
    sample = blocker.args[0]
    assert (sample.device_used_bytes, sample.process_used_bytes) == (4.0 * GiB, 3.0 * GiB)
    probe.watch(0)
    probe.close()
