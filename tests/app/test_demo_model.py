"""End to end with the real worker and the bundled demo model on the CPU: send and see tokens,
stop, regenerate, edit and resend; the conversation is there after a restart of the window;
closing the window mid-answer ends the worker and exits within seconds. Few and fast: the
demo model loads in ~2 s and answers in tens of tokens."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.history.conversation import ChatSettings
from app.history.conversation_store import FILE_NAME, ConversationStore
from app.main_window import MainWindow
from app.paths import DEMO_MODEL_DIR
from app.worker.worker_client import WorkerClient
from engine.events import LoadRequest

pytest.importorskip("torch")  # the engine's side; the app itself never imports it
if not (DEMO_MODEL_DIR / "model.safetensors").is_file():
    pytest.skip("the bundled demo model is missing", allow_module_level=True)

SLOW_WORKER = (sys.executable, str(Path(__file__).resolve().parent / "slow_worker.py"))
# a seed whose answer runs ~250 tokens (~5 s throttled): a stop or a close lands mid-answer
LONG_PROMPT = "Write a long story about the locale module"
LONG = ChatSettings(max_new_tokens=400, temperature=1.3, seed=10)
SHORT = ChatSettings(max_new_tokens=16, temperature=1.0, seed=1)
LOAD_TIMEOUT_MS = 60_000
CLOSE_LIMIT_S = 5.0


@pytest.fixture
def open_window(qtbot, settings, tmp_path):
    """open_window(load=True) -> a shown MainWindow on the real (token-throttled) worker, its
    store opened afresh from the same file each time, as at a start of the app."""
    opened = []

    def open_(load: bool = True) -> MainWindow:
        store = ConversationStore(tmp_path / "data" / FILE_NAME)
        worker = WorkerClient(SLOW_WORKER, env={"HEARTH_TOKEN_DELAY_S": "0.02"})
        window = MainWindow(store, worker, settings)
        opened.append(window)
        window.show()
        window.activateWindow()
        qtbot.waitActive(window)
        if load:
            with qtbot.waitSignal(worker.sig_loaded, timeout=LOAD_TIMEOUT_MS) as blocker:
                window.start(LoadRequest())  # the demo model, as `hearth` starts
            assert Path(blocker.args[0].model) == DEMO_MODEL_DIR
        else:
            window.start(LoadRequest())
        return window

    yield open_
    for window in opened:
        window.worker.kill()
        window.close()
        window.store.close()
        window.deleteLater()  # as make_window does (tests/app/conftest.py says why)
    if opened:
        from PySide6.QtCore import QCoreApplication, QEvent

        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def answer(qtbot, window, text: str | None = None, click=None) -> list[str]:
    """Send `text` with Ctrl+Enter (or click `click`); the token texts once the answer ended."""
    tokens = []
    window.worker.sig_token.connect(lambda e: tokens.append(e.text))
    with qtbot.waitSignal(window.controller.sig_generating_changed, timeout=30_000,
                          check_params_cb=lambda is_on: not is_on):
        if click is not None:
            qtbot.mouseClick(click, Qt.MouseButton.LeftButton)
        else:
            window.chat_view.input.setPlainText(text)
            qtbot.keyClick(window.chat_view.input, Qt.Key.Key_Return,
                           Qt.KeyboardModifier.ControlModifier)
    return tokens


def close_and_time(qtbot, window) -> float:
    pid = window.worker.pid
    t0 = time.monotonic()
    with qtbot.waitSignal(window.sig_closed, timeout=int(CLOSE_LIMIT_S * 1000)):
        window.close()
    seconds = time.monotonic() - t0
    assert not window.worker.is_running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not left behind
    return seconds


def test_stop_regenerate_edit_send_and_restart(qtbot, open_window):
    window = open_window()
    chat, controller = window.chat_view, window.controller
    cid = controller.conversation.id
    controller.update_settings(cid, LONG)

    chat.input.setPlainText(LONG_PROMPT)  # stop: Esc after the first token
    with qtbot.waitSignal(window.worker.sig_token, timeout=30_000):
        qtbot.mouseClick(chat.send_button, Qt.MouseButton.LeftButton)
    qtbot.keyClick(chat.input, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not controller.is_generating, timeout=10_000)
    user, stopped = window.store.messages(cid)
    assert (stopped.status, stopped.finish_reason) == ("cancelled", "cancelled")
    assert stopped.content and chat.message_views[stopped.id].status_label.text() == "stopped"

    controller.update_settings(cid, SHORT)
    tokens = answer(qtbot, window, click=chat.regenerate_button)
    user, again = window.store.messages(cid)
    assert again.id != stopped.id and again.status == "done"
    assert len(tokens) > 1 and again.content == "".join(tokens)
    assert chat.message_views[again.id].answer_view.markdown == again.content
    assert f"/ {1024:,} tokens" in chat.context_label.text()  # the demo model's context

    qtbot.mouseClick(chat.message_views[user.id].edit_button, Qt.MouseButton.LeftButton)
    answer(qtbot, window, "What does os.getcwd do?")
    answer(qtbot, window, "And os.path.join?")
    messages = window.store.messages(cid)
    assert [(m.role, m.status) for m in messages] == [("user", "done"), ("assistant", "done")] * 2
    assert messages[0].content == "What does os.getcwd do?" and messages[0].id == user.id

    assert close_and_time(qtbot, window) < CLOSE_LIMIT_S
    window = open_window(load=False)  # a restart: the same conversation, read from disk
    assert window.controller.conversation.id == cid
    assert window.store.messages(cid) == messages
    shown = window.chat_view.message_views
    assert [shown[m.id].answer_view.markdown for m in messages] == [m.content for m in messages]
    assert close_and_time(qtbot, window) < CLOSE_LIMIT_S  # while loading, too


def test_closing_mid_answer_ends_the_worker_and_keeps_the_partial_answer(qtbot, open_window):
    window = open_window()
    window.controller.update_settings(window.controller.conversation.id, LONG)
    window.chat_view.input.setPlainText(LONG_PROMPT)
    with qtbot.waitSignal(window.worker.sig_token, timeout=30_000):
        window.chat_view.send_button.click()
    assert window.controller.is_generating
    assert close_and_time(qtbot, window) < CLOSE_LIMIT_S
    partial = window.store.messages(window.controller.conversation.id)[-1]
    # the worker ends the stream as cancelled before it exits; a kill leaves it interrupted
    assert partial.status in ("cancelled", "interrupted") and partial.content
