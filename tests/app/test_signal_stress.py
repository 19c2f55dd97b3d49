"""Thousands of signal emissions, as a long answer makes. PySide6 6.12.0 on Python 3.11 aborts
(bool_dealloc) after a few hundred; this guards the 6.11.3 pin."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Signal

from engine.events import GenerateRequest, LoadRequest, Token
from tests.app.conftest import recording

NUM_EMITS = 6_000


class Emitter(QObject):
    sig_object = Signal(object)
    """A payload object."""
    sig_float = Signal(float)
    """A byte count (floats: Signal(int) is 32-bit)."""
    sig_bool = Signal(bool)
    """A flag."""
    sig_str = Signal(str)
    """A text."""


def test_thousands_of_direct_emits():
    emitter = Emitter()
    received = []
    for sig in (emitter.sig_object, emitter.sig_float, emitter.sig_bool, emitter.sig_str):
        sig.connect(received.append)
    for i in range(NUM_EMITS):
        emitter.sig_object.emit(Token(text=str(i), token_ids=(i,)))
        emitter.sig_float.emit(float(i) * 2**33)  # past 32 bits
        emitter.sig_bool.emit(i % 2 == 0)
        emitter.sig_str.emit("é" * (i % 5))
    assert len(received) == 4 * NUM_EMITS
    assert received[-4] == Token(str(NUM_EMITS - 1), (NUM_EMITS - 1,))
    assert received[-3] == (NUM_EMITS - 1) * 2.0**33


def test_thousands_of_queued_emits_from_another_thread(qtbot):
    emitter = Emitter()
    received = []

    class Receiver(QObject):
        def on_object(self, value) -> None:
            received.append(value)

        def on_bool(self, value) -> None:
            received.append(value)

    receiver = Receiver()
    emitter.sig_object.connect(receiver.on_object)
    emitter.sig_bool.connect(receiver.on_bool)

    def emit_all() -> None:
        for i in range(NUM_EMITS):
            emitter.sig_object.emit(Token(text="x", token_ids=(i,)))
            emitter.sig_bool.emit(True)

    thread = threading.Thread(target=emit_all)
    thread.start()
    qtbot.waitUntil(lambda: len(received) == 2 * NUM_EMITS, timeout=20_000)
    thread.join()


def test_thousands_of_tokens_through_the_worker_client(qtbot, make_worker):
    num_recorded = sum(e["event"] == "token" for e in recording("generate_hello.jsonl"))
    repeat = NUM_EMITS // num_recorded + 1
    worker = make_worker(HEARTH_FAKE_DELAY_S="0", HEARTH_FAKE_REPEAT=str(repeat))
    with qtbot.waitSignal(worker.sig_loaded, timeout=10_000):
        worker.send(LoadRequest())
    tokens = []
    worker.sig_token.connect(tokens.append)
    with qtbot.waitSignal(worker.sig_finished, timeout=30_000):
        worker.send(GenerateRequest(messages=({"role": "user", "content": "go on"},)))
    assert len(tokens) == repeat * num_recorded >= NUM_EMITS
