"""A load in progress can be abandoned: cancel is checked between load stages, and the worker
ends the load's stream with Finished("cancelled") and stays usable."""

from __future__ import annotations

import io
import threading

import pytest

from engine.cli.worker import Worker
from engine.events import LoadRequest, event_from_json
from engine.generate.session import Session
from engine.load.loader import LoadCancelled


def test_session_load_stops_at_the_next_stage(tiny_model):
    cancel = threading.Event()
    stages = []

    def progress(event):
        stages.append(event.stage)
        cancel.set()  # the user cancels while the first stage runs

    with pytest.raises(LoadCancelled):
        Session.load(LoadRequest(str(tiny_model), device="cpu"), progress, cancel)
    assert stages == ["tokenizer"]


def test_worker_reports_a_cancelled_load_and_loads_again(tiny_model):
    out = io.StringIO()
    worker = Worker(out)
    cancelled = threading.Event()
    cancelled.set()
    worker._run(LoadRequest(str(tiny_model), device="cpu"), cancelled)
    worker._run(LoadRequest(str(tiny_model), device="cpu"), threading.Event())
    events = [event_from_json(line) for line in out.getvalue().splitlines()]
    terminal = [e for e in events if e.name in ("finished", "loaded", "failed")]
    assert [e.name for e in terminal] == ["finished", "loaded"]
    assert terminal[0].reason == "cancelled"
