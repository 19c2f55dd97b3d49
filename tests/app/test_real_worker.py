"""A few round trips through the real worker (python -m engine.cli.worker) on a tiny CPU model:
the protocol the fake worker imitates, checked against the engine itself."""

from __future__ import annotations

import pytest

from app.chat.chat_controller import ChatController
from app.worker.worker_client import WorkerClient
from engine.events import LoadRequest

pytest.importorskip("torch")  # the engine's side; the app itself never imports it


def test_load_send_regenerate_and_shutdown(qtbot, store, tiny_model):
    worker = WorkerClient()  # the default command: python -m engine.cli.worker
    controller = ChatController(store, worker)
    controller.show_latest_or_new()
    try:
        with qtbot.waitSignal(worker.sig_loaded, timeout=60_000) as blocker:
            worker.send(LoadRequest(model=str(tiny_model), device="cpu", context=128))
        assert blocker.args[0].context == 128 and blocker.args[0].device == "cpu"
        tokens = []
        worker.sig_token.connect(tokens.append)
        for action in (lambda: controller.send("Hello there"), controller.regenerate):
            with qtbot.waitSignal(worker.sig_finished, timeout=60_000) as blocker:
                assert action()
            assert blocker.args[0].reason in ("eos", "max_tokens", "stop_string")
        user, answer = store.messages(controller.conversation.id)
        assert answer.status == "done" and answer.content == controller.messages()[-1].content
        assert answer.stats.context_used_tokens > answer.stats.prompt_tokens > 0
        assert tokens
        with qtbot.assertNotEmitted(worker.sig_worker_died), qtbot.waitSignal(
                worker.sig_stopped, timeout=10_000):
            worker.shutdown()
    finally:
        worker.kill()
