"""WorkerClient against the fake worker: typed signals in strict order, partial lines, noise
on stdout, crashes, and clean shutdown."""

from __future__ import annotations

import pytest

from app.worker.worker_client import JsonLineReader, WorkerClient, WorkerDied
from engine.events import (
    Finished,
    GenerateRequest,
    Loaded,
    LoadProgress,
    LoadRequest,
    Token,
    UnloadRequest,
)
from tests.app.conftest import recorded_text, recording

HELLO = GenerateRequest(messages=({"role": "user", "content": "hi"},))
SIGNAL_OF = {"load_progress": "sig_load_progress", "loaded": "sig_loaded",
             "prefill_progress": "sig_prefill_progress", "token": "sig_token",
             "stats": "sig_stats", "finished": "sig_finished", "failed": "sig_failed"}


def expected_signals(worker: WorkerClient, name: str) -> list:
    return [getattr(worker, SIGNAL_OF[e["event"]]) for e in recording(name)]


def load(qtbot, worker: WorkerClient) -> Loaded:
    with qtbot.waitSignal(worker.sig_loaded, timeout=10_000) as blocker:
        worker.send(LoadRequest())
    return blocker.args[0]


def test_line_reader_joins_partial_lines_and_split_utf8():
    reader = JsonLineReader()
    data = '{"text": "Café"}\n{"text": "b"}\n'.encode()
    cut = data.index("é".encode()) + 1  # inside the two bytes of "é"
    assert reader.feed(data[:5]) == []
    assert reader.feed(data[5:cut]) == []
    assert reader.feed(data[cut:-3]) == ['{"text": "Café"}']
    assert reader.feed(data[-3:]) == ['{"text": "b"}']
    assert reader.feed(b"\n\n  \n") == []
    assert reader.feed(b'{"tail": 1}') == []
    assert reader.flush() == ['{"tail": 1}']


def record_events(worker: WorkerClient) -> list:
    events: list = []
    for name in set(SIGNAL_OF.values()):
        getattr(worker, name).connect(events.append)
    return events


def test_load_then_generate_emit_typed_signals_in_strict_order(qtbot, make_worker):
    worker = make_worker()
    events = record_events(worker)
    with qtbot.waitSignals(expected_signals(worker, "load.jsonl"), order="strict",
                           timeout=10_000):
        worker.send(LoadRequest())
    assert [type(e) for e in events] == [LoadProgress] * 5 + [Loaded]
    assert events[-1].context == 2048 and events[-1].pid == worker.pid
    assert worker.busy is None

    events.clear()
    with qtbot.waitSignals(expected_signals(worker, "generate_hello.jsonl"), order="strict",
                           timeout=10_000):
        worker.send(HELLO)
        assert worker.busy == "generate"
    assert [e.name for e in events] == [e["event"] for e in recording("generate_hello.jsonl")]
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.reason == "eos"
    assert finished.stats.context_used_tokens == 47
    tokens = [e for e in events if isinstance(e, Token)]
    assert "".join(t.text for t in tokens) == recorded_text("generate_hello.jsonl")
    assert any(t.text == "" for t in tokens)  # an incomplete character travels as ""
    assert all(isinstance(t.token_ids, tuple) for t in tokens)


def test_one_stream_at_a_time(qtbot, make_worker):
    worker = make_worker(HEARTH_FAKE_DELAY_S="0.05")
    worker.send(LoadRequest())
    with pytest.raises(RuntimeError, match="busy"):
        worker.send(HELLO)
    qtbot.waitSignal(worker.sig_loaded, timeout=10_000).wait()


def test_unload_is_a_stream_of_its_own(qtbot, make_worker):
    worker = make_worker()
    load(qtbot, worker)
    with qtbot.waitSignal(worker.sig_finished, timeout=10_000) as blocker:
        worker.send(UnloadRequest())
        assert worker.busy == "unload"
    assert blocker.args[0].reason == "unloaded"  # engine/cli/worker.py's answer to an unload
    assert worker.busy is None and worker.ended_command == "unload"


def test_stdout_noise_is_skipped(qtbot, make_worker):
    worker = make_worker(HEARTH_FAKE_NOISE="1")
    assert load(qtbot, worker).model == "demo-qwen2-tiny"


def test_cancel_ends_in_finished_cancelled(qtbot, make_worker):
    worker = make_worker(HEARTH_FAKE_DELAY_S="0.05")
    load(qtbot, worker)
    with qtbot.waitSignal(worker.sig_token, timeout=10_000):
        worker.send(HELLO)
    with qtbot.waitSignal(worker.sig_finished, timeout=10_000) as blocker:
        worker.cancel()
    assert blocker.args[0].reason == "cancelled"
    assert worker.busy is None


def test_crash_mid_stream_is_reported_and_a_new_worker_starts(qtbot, make_worker):
    worker = make_worker(HEARTH_FAKE_CRASH_AFTER="3")
    first_pid = load(qtbot, worker).pid
    with qtbot.assertNotEmitted(worker.sig_finished), qtbot.waitSignal(
            worker.sig_worker_died, timeout=10_000) as blocker:
        worker.send(HELLO)
    died = blocker.args[0]
    assert isinstance(died, WorkerDied)
    assert died.exit_code == 3 and died.command == "generate"
    assert "simulated crash" in died.stderr_tail
    assert "while running a generate" in died.message
    assert not worker.is_running and worker.busy is None
    assert load(qtbot, worker).pid != first_pid


def test_shutdown_is_clean(qtbot, make_worker):
    worker = make_worker()
    load(qtbot, worker)
    with qtbot.assertNotEmitted(worker.sig_worker_died), qtbot.waitSignal(
            worker.sig_stopped, timeout=5_000):
        worker.shutdown()
    assert not worker.is_running


def test_kill_then_load_at_once(qtbot, make_worker):
    worker = make_worker(HEARTH_FAKE_DELAY_S="0.2")
    worker.send(LoadRequest())
    qtbot.waitSignal(worker.sig_load_progress, timeout=10_000).wait()
    with qtbot.assertNotEmitted(worker.sig_worker_died):
        worker.kill()
        worker.extra_env["HEARTH_FAKE_DELAY_S"] = "0"
        assert load(qtbot, worker).model == "demo-qwen2-tiny"


def test_a_worker_that_cannot_start_is_reported(qtbot):
    worker = WorkerClient(["/nonexistent/hearth-worker"])
    with qtbot.waitSignal(worker.sig_worker_died, timeout=5_000) as blocker:
        worker.send(LoadRequest())
    assert "could not start the engine" in blocker.args[0].message
    assert worker.busy is None and not worker.is_running
