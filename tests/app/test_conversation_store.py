"""The SQLite store: WAL, conversations and messages, and nothing lost when the app is killed
mid-answer (the partial answer is kept and marked interrupted on the next start)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from app.chat.chat_controller import FLUSH_INTERVAL_MS, ChatController
from app.history.conversation import ChatSettings
from app.history.conversation_store import FILE_NAME, ConversationStore
from engine.events import LoadRequest, Stats
from tests.app.conftest import FAKE_COMMAND, recorded_text

REPO = Path(__file__).resolve().parents[2]


def test_store_round_trip(tmp_path):
    store = ConversationStore(tmp_path / FILE_NAME)
    assert store.journal_mode == "wal"
    settings = ChatSettings(system_prompt="Be brief.", temperature=0.2, top_k=20)
    a = store.create_conversation("A", settings)
    b = store.create_conversation()
    user = store.add_message(a.id, "user", "hi")
    answer = store.add_message(a.id, "assistant", "", "streaming")
    store.set_content(answer.id, "Hel")
    stats = Stats(new_tokens=3, context_used_tokens=12, vram_used_bytes=5 * 2**33)
    done = store.finish_message(answer.id, "Hello", "done", "eos", stats=stats)
    assert (done.content, done.status, done.finish_reason) == ("Hello", "done", "eos")
    assert done.stats == stats  # byte counts past 32 bits survive
    assert [c.id for c in store.conversations()] == [a.id, b.id]  # most recently active first
    assert store.conversation(a.id).settings == settings
    store.delete_messages_after(a.id, user.id)
    assert [m.id for m in store.messages(a.id)] == [user.id]
    store.delete_conversation(a.id)
    assert store.messages(a.id) == [] and store.conversation(a.id) is None
    store.close()


def test_reopening_marks_streaming_answers_interrupted(tmp_path):
    store = ConversationStore(tmp_path / FILE_NAME)
    cid = store.create_conversation().id
    mid = store.add_message(cid, "assistant", "partial", "streaming").id
    store.close()
    store = ConversationStore(tmp_path / FILE_NAME)
    assert store.num_interrupted == 1
    assert (store.message(mid).status, store.message(mid).content) == ("interrupted", "partial")
    store.close()


def test_streamed_tokens_are_persisted_while_streaming(qtbot, store, make_worker):
    worker = make_worker(HEARTH_FAKE_DELAY_S="0.03")
    controller = ChatController(store, worker)
    controller.show_latest_or_new()
    with qtbot.waitSignal(worker.sig_loaded, timeout=10_000):
        worker.send(LoadRequest())
    assert controller.send("hi")
    answer_id = controller.streaming_message.id
    other = sqlite3.connect(store.path)  # what another process would see after a kill

    def persisted() -> str:
        return other.execute("SELECT content FROM messages WHERE id=?", (answer_id,)).fetchone()[0]

    qtbot.waitUntil(lambda: len(persisted()) > 0, timeout=3 * FLUSH_INTERVAL_MS + 2_000)
    assert controller.is_generating
    assert recorded_text("generate_hello.jsonl").startswith(persisted())
    with qtbot.waitSignal(worker.sig_finished, timeout=10_000):
        pass
    assert persisted() == recorded_text("generate_hello.jsonl")
    other.close()


KILL_MID_ANSWER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from PySide6.QtCore import QCoreApplication, QTimer
    from app.chat.chat_controller import ChatController
    from app.history.conversation_store import ConversationStore
    from app.worker.worker_client import WorkerClient
    from engine.events import LoadRequest

    app = QCoreApplication([])
    store = ConversationStore(Path(sys.argv[1]))
    worker = WorkerClient({command!r}, env={{"HEARTH_FAKE_DELAY_S": "0.05"}})
    controller = ChatController(store, worker)
    controller.show_latest_or_new()
    tokens = []

    def on_token(event):
        tokens.append(event)
        if len(tokens) == 6:  # a few tokens in, and a flush later: killed without warning
            QTimer.singleShot(400, lambda: os.kill(os.getpid(), signal.SIGKILL))

    worker.sig_token.connect(on_token)
    worker.sig_loaded.connect(lambda event: controller.send("hi"))
    worker.send(LoadRequest())
    app.exec()
""")


def test_a_killed_app_keeps_the_partial_answer_marked_interrupted(tmp_path):
    path = tmp_path / FILE_NAME
    script = KILL_MID_ANSWER.format(repo=str(REPO), command=list(FAKE_COMMAND))
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.run([sys.executable, "-c", script, str(path)], env=env, timeout=30,
                          capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    store = ConversationStore(path)
    assert store.num_interrupted == 1
    conversation = store.conversations()[0]
    user, answer = store.messages(conversation.id)
    assert (user.content, answer.status) == ("hi", "interrupted")
    full = recorded_text("generate_hello.jsonl")
    assert answer.content and full.startswith(answer.content) and answer.content != full
    store.close()
