"""App tests: offscreen Qt, data and settings in tmp folders, and a fake worker process that
replays recorded event streams (fake_worker.py, recordings/)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import gc  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from PySide6.QtCore import QSettings  # noqa: E402

from app.app_settings import AppSettings  # noqa: E402
from app.history.conversation_store import FILE_NAME, ConversationStore  # noqa: E402
from app.worker.worker_client import WorkerClient  # noqa: E402
from engine.events import request_from_json  # noqa: E402

FAKE_WORKER = Path(__file__).resolve().parent / "fake_worker.py"
RECORDINGS = Path(__file__).resolve().parent / "recordings"
FAKE_COMMAND = (sys.executable, str(FAKE_WORKER))


def recording(name: str) -> list[dict]:
    return [json.loads(line) for line in (RECORDINGS / name).read_text().splitlines() if line]


def recorded_text(name: str) -> str:
    return "".join(e["text"] for e in recording(name) if e["event"] == "token")


@pytest.fixture(autouse=True)
def _collect_on_the_gui_thread():
    """What the app's GuiThreadGC does, a test long: no automatic collection, which could run on
    a thread of the test's or an earlier test's (an engine, a server, a download) and destroy a
    Qt object there; one collection here, on the GUI thread, after qtbot has closed the widgets
    (an autouse fixture is set up first, so it is torn down last)."""
    enabled = gc.isenabled()
    gc.disable()
    yield
    gc.collect()
    if enabled:
        gc.enable()


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    # Hearth's own models (imports, the starter) and Ollama's: never the user's real ones
    monkeypatch.setenv("HEARTH_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)


@pytest.fixture
def fake_log(tmp_path):
    """The path the fake worker appends its commands to, and a reader of them as requests."""
    path = tmp_path / "commands.jsonl"

    def read() -> list:
        if not path.exists():
            return []
        return [request_from_json(line) for line in path.read_text().splitlines() if line]

    read.path = path
    return read


@pytest.fixture
def make_worker(qtbot, fake_log):
    """make_worker(**env) -> a WorkerClient running the fake worker; ended after the test."""
    workers = []

    def make(**env: str) -> WorkerClient:
        env = {"HEARTH_FAKE_LOG": str(fake_log.path), **env}
        worker = WorkerClient(FAKE_COMMAND, env=env)
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.kill()


@pytest.fixture
def settings(tmp_path) -> AppSettings:
    return AppSettings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))


@pytest.fixture
def store(tmp_path):
    s = ConversationStore(tmp_path / "data" / FILE_NAME)
    yield s
    s.close()


@pytest.fixture
def make_window(qtbot, make_worker, store, settings):
    """make_window(**env) -> a shown MainWindow whose fake worker has loaded the demo model."""
    from app.main_window import MainWindow
    from engine.events import LoadRequest

    windows = []

    def make(load: bool = True, **env: str):
        worker = make_worker(**env)
        window = MainWindow(store, worker, settings)
        windows.append(window)
        window.show()
        window.activateWindow()  # window shortcuts (Ctrl+Enter, Esc) need an active window
        qtbot.waitActive(window)
        if load:
            with qtbot.waitSignal(worker.sig_loaded, timeout=10_000):
                window.start(LoadRequest())
        return window

    yield make
    for window in windows:  # before the store closes
        window.worker.kill()
        window.close()
        # deleted, not just closed: a closed window lives to the end of the session otherwise,
        # and every later style change re-polishes it (a theme test took 80 s late in the
        # suite against 1.3 s alone)
        window.deleteLater()
    if windows:
        from PySide6.QtCore import QCoreApplication, QEvent

        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)

