"""Quitting right at start: ending the worker while its process is still
starting raises nothing, from the client or from the window."""

from __future__ import annotations

from PySide6.QtCore import QProcess

from app.main_window import MainWindow
from app.worker.worker_client import WorkerClient
from engine.events import LoadRequest
from tests.app.conftest import FAKE_COMMAND


def test_kill_while_the_process_is_starting(qtbot):
    worker = WorkerClient(FAKE_COMMAND)
    worker.send(LoadRequest())
    assert worker._process.state() == QProcess.ProcessState.Starting  # the race's window
    # kill() waits for the process, which first emits `started` for the process it let go of
    with qtbot.waitSignal(worker.sig_stopped, timeout=5_000), \
            qtbot.assertNotEmitted(worker.sig_worker_died):
        worker.kill()
    qtbot.wait(200)  # anything the let-go process still emits arrives now
    assert not worker.is_running and worker.busy is None


def test_closing_the_window_as_it_starts(qtbot, store, settings):
    worker = WorkerClient(FAKE_COMMAND)
    window = MainWindow(store, worker, settings)
    window.show()
    window.start(LoadRequest())
    with qtbot.waitSignal(window.sig_closed, timeout=10_000):
        window.close()
    assert not worker.is_running
