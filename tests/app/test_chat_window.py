"""The main window end to end against the fake worker: send, stream, finish; stop; regenerate;
edit and resend; reasoning; errors; a crash of the worker; closing mid-answer."""

from __future__ import annotations

import re
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from app.chat.conversation_settings_dialog import ConversationSettingsDialog
from app.history.conversation import ChatSettings
from engine.events import CancelRequest, GenerateRequest, LoadRequest, ShutdownRequest
from tests.app.conftest import recorded_text

HELLO_TEXT = recorded_text("generate_hello.jsonl")


def send(qtbot, window, text: str) -> None:
    """Type and press Ctrl+Enter; returns when the answer has ended."""
    chat = window.chat_view
    chat.input.setPlainText(text)
    with qtbot.waitSignal(window.controller.sig_generating_changed, timeout=10_000,
                          check_params_cb=lambda is_on: not is_on):
        qtbot.keyClick(chat.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)


def generates(fake_log) -> list[GenerateRequest]:
    return [r for r in fake_log() if isinstance(r, GenerateRequest)]


def test_send_streams_and_finishes(qtbot, make_window, store, fake_log):
    window = make_window()
    chat = window.chat_view
    assert chat.send_button.isEnabled() and not chat.stop_button.isEnabled()
    streamed = []
    window.controller.sig_message_updated.connect(streamed.append)
    send(qtbot, window, "Write me some code")

    assert len(streamed) > 10  # token by token, then the final message
    conversation = window.controller.conversation
    user, answer = store.messages(conversation.id)
    assert (user.role, user.content) == ("user", "Write me some code")
    assert (answer.content, answer.status, answer.finish_reason) == (HELLO_TEXT, "done", "eos")
    assert answer.stats.context_used_tokens == 47
    assert conversation.title == "Write me some code"
    view = chat.message_views[answer.id]
    assert view.answer_view.markdown == HELLO_TEXT
    assert "def add(a, b):" in view.answer_view.toPlainText()
    assert "```" not in view.answer_view.toPlainText()  # rendered, not shown raw
    assert chat.context_label.text() == "Context 47 / 2,048 tokens (2%)"
    assert chat.input.toPlainText() == ""
    assert chat.send_button.isEnabled()
    [request] = generates(fake_log)
    assert request.messages == ({"role": "user", "content": "Write me some code"},)


def test_escape_stops_the_answer(qtbot, make_window, store, fake_log):
    window = make_window(HEARTH_FAKE_DELAY_S="0.05")
    chat = window.chat_view
    chat.input.setPlainText("Tell me a story")
    with qtbot.waitSignal(window.worker.sig_token, timeout=10_000):
        qtbot.mouseClick(chat.send_button, Qt.MouseButton.LeftButton)
    assert chat.stop_button.isEnabled() and not chat.send_button.isEnabled()
    with qtbot.waitSignal(window.controller.sig_generating_changed, timeout=10_000):
        qtbot.keyClick(chat.input, Qt.Key.Key_Escape)
    answer = store.messages(window.controller.conversation.id)[-1]
    assert (answer.status, answer.finish_reason) == ("cancelled", "cancelled")
    assert answer.content and len(answer.content) < len(HELLO_TEXT)
    assert chat.message_views[answer.id].status_label.text() == "stopped"
    assert any(isinstance(r, CancelRequest) for r in fake_log())


def test_regenerate_replaces_the_last_answer(qtbot, make_window, store, fake_log):
    window = make_window()
    send(qtbot, window, "hi")
    first_answer = store.messages(window.controller.conversation.id)[-1]
    view = window.chat_view.message_views[first_answer.id]
    assert view.regenerate_button.isVisibleTo(view)
    with qtbot.waitSignal(window.controller.sig_generating_changed, timeout=10_000,
                          check_params_cb=lambda is_on: not is_on):
        qtbot.mouseClick(view.regenerate_button, Qt.MouseButton.LeftButton)
    user, answer = store.messages(window.controller.conversation.id)
    assert answer.id != first_answer.id and answer.content == HELLO_TEXT
    first, second = generates(fake_log)
    assert first.messages == second.messages == ({"role": "user", "content": "hi"},)


def test_edit_and_resend_drops_what_followed(qtbot, make_window, store, fake_log):
    window = make_window()
    send(qtbot, window, "first question")
    send(qtbot, window, "second question")
    cid = window.controller.conversation.id
    first_user = store.messages(cid)[0]
    view = window.chat_view.message_views[first_user.id]
    qtbot.mouseClick(view.edit_button, Qt.MouseButton.LeftButton)
    assert window.chat_view.edit_banner.isVisibleTo(window.chat_view)
    assert window.chat_view.input.toPlainText() == "first question"
    send(qtbot, window, "first question, edited")

    messages = store.messages(cid)
    assert [(m.role, m.content) for m in messages] == [
        ("user", "first question, edited"), ("assistant", HELLO_TEXT)]
    assert messages[0].id == first_user.id
    assert generates(fake_log)[-1].messages == (
        {"role": "user", "content": "first question, edited"},)
    assert not window.chat_view.edit_banner.isVisibleTo(window.chat_view)


def test_reasoning_is_collapsed_and_left_out_of_the_history(qtbot, make_window, fake_log):
    window = make_window(HEARTH_FAKE_GENERATE="generate_think.jsonl")
    send(qtbot, window, "hi")
    answer = window.controller.messages()[-1]
    view = window.chat_view.message_views[answer.id]
    assert view.answer_view.toPlainText() == "Hi there!"
    assert view.think_button.isVisibleTo(view)
    assert re.fullmatch(r"Thought for \d+\.\d s \(4 words\)", view.think_button.text())
    assert not view.reasoning_view.isVisibleTo(view)
    view.think_button.click()
    assert view.reasoning_view.isVisibleTo(view)
    assert view.reasoning_view.toPlainText() == "The user says hi."
    send(qtbot, window, "and again")
    assert generates(fake_log)[-1].messages[1] == {"role": "assistant", "content": "Hi there!"}


def test_copy_puts_the_markdown_on_the_clipboard(qtbot, make_window):
    window = make_window()
    send(qtbot, window, "hi")
    answer = window.controller.messages()[-1]
    window.chat_view.message_views[answer.id].copy_button.click()
    assert QGuiApplication.clipboard().text() == HELLO_TEXT


def test_each_conversation_sends_its_own_settings(qtbot, make_window, fake_log):
    window = make_window()
    controller = window.controller
    pirate = ChatSettings(system_prompt="You are a pirate.", temperature=0.0, seed=7,
                          max_new_tokens=64)
    controller.update_settings(controller.conversation.id, pirate)
    send(qtbot, window, "ahoy")
    window.conversation_list.new_button.click()
    assert window.conversation_list.list.count() == 2
    controller.update_settings(controller.conversation.id, ChatSettings(top_p=0.5))
    send(qtbot, window, "hello")
    first, second = generates(fake_log)
    assert (first.system, first.max_new_tokens) == ("You are a pirate.", 64)
    assert (first.sampling.temperature, first.sampling.seed) == (0.0, 7)
    assert second.system is None and second.sampling.top_p == 0.5
    assert second.messages == ({"role": "user", "content": "hello"},)
    # back to the first conversation from the sidebar
    window.conversation_list.list.setCurrentRow(1)
    assert controller.conversation.title == "ahoy"
    assert len(window.chat_view.message_views) == 2


def test_a_failed_generation_is_shown_in_the_window(qtbot, make_window, store):
    window = make_window(HEARTH_FAKE_GENERATE="generate_failed.jsonl")
    send(qtbot, window, "hi")
    answer = store.messages(window.controller.conversation.id)[-1]
    assert (answer.status, answer.content) == ("failed", "Sure")
    assert window.notice.isVisibleTo(window)
    assert "ran out of memory" in window.notice.text
    assert "4-bit" in window.notice.text  # the hint


def test_a_chat_outgrowing_the_context_says_what_was_left_out(qtbot, make_window, store):
    window = make_window(HEARTH_FAKE_GENERATE="generate_trimmed.jsonl")
    send(qtbot, window, "hi")
    answer = store.messages(window.controller.conversation.id)[-1]
    assert (answer.status, answer.content) == ("done", "Still here.")
    assert window.notice.isVisibleTo(window)
    assert "oldest 4 message(s)" in window.notice.text


def test_a_failed_load_is_shown_in_the_window(qtbot, make_window):
    window = make_window(load=False, HEARTH_FAKE_LOAD="load_failed.jsonl")
    with qtbot.waitSignal(window.worker.sig_failed, timeout=10_000):
        window.start(LoadRequest(model="/models/mamba"))
    assert "Could not load the model: architecture MambaForCausalLM" in window.notice.text
    assert not window.chat_view.send_button.isEnabled()
    assert "load failed" in window.model_status.label.text()


def test_a_worker_crash_keeps_the_partial_answer_and_can_restart(qtbot, make_window, store):
    window = make_window(HEARTH_FAKE_CRASH_AFTER="4")
    with qtbot.waitSignal(window.worker.sig_worker_died, timeout=10_000):
        window.chat_view.input.setPlainText("hi")
        window.chat_view.send_button.click()
    answer = store.messages(window.controller.conversation.id)[-1]
    assert (answer.status, answer.content) == ("interrupted", "Hello! Here is")
    assert window.notice.isVisibleTo(window)
    assert "exited with code 3 while running a generate" in window.notice.text
    assert "simulated crash" in window.notice.text
    assert window.notice.action_button.text() == "Restart engine"
    assert not window.chat_view.send_button.isEnabled()

    del window.worker.extra_env["HEARTH_FAKE_CRASH_AFTER"]
    with qtbot.waitSignal(window.worker.sig_loaded, timeout=10_000):
        window.notice.action_button.click()
    assert window.chat_view.send_button.isEnabled()
    send(qtbot, window, "again")
    assert store.messages(window.controller.conversation.id)[-1].content == HELLO_TEXT


def test_closing_mid_answer_ends_the_worker_and_keeps_the_partial_answer(
        qtbot, make_window, store, fake_log):
    window = make_window(HEARTH_FAKE_DELAY_S="0.05")
    window.chat_view.input.setPlainText("hi")
    with qtbot.waitSignal(window.worker.sig_token, timeout=10_000):
        window.chat_view.send_button.click()
    with qtbot.waitSignal(window.sig_closed, timeout=5_000):
        window.close()
    assert not window.isVisible() and not window.worker.is_running
    assert any(isinstance(r, ShutdownRequest) for r in fake_log())
    answer = store.messages(window.controller.conversation.id)[-1]
    assert answer.status == "interrupted" and answer.content


def test_conversation_settings_dialog_saves_per_conversation(qtbot, make_window, store):
    window = make_window()
    conversation = window.controller.conversation
    window.chat_view.settings_button.click()
    dialog = window.findChild(ConversationSettingsDialog)
    assert dialog.isVisible() and dialog.conversation == conversation
    dialog.title_edit.setText("Recipes")
    dialog.system_edit.setPlainText("You are a chef.")
    box, spin = dialog.overrides["temperature"]
    box.setChecked(True)
    spin.setValue(0.3)
    dialog.accept()
    saved = store.conversation(conversation.id)
    assert saved.title == "Recipes" and window.chat_view.title_label.text() == "Recipes"
    assert (saved.settings.system_prompt, saved.settings.temperature) == ("You are a chef.", 0.3)
    assert saved.settings.top_p is None  # unticked: the model's default


def test_deleting_the_conversation_being_answered(qtbot, make_window, store):
    window = make_window(HEARTH_FAKE_DELAY_S="0.05")
    window.chat_view.input.setPlainText("hi")
    with qtbot.waitSignal(window.worker.sig_token, timeout=10_000):
        window.chat_view.send_button.click()
    doomed = window.controller.conversation.id
    with qtbot.waitSignal(window.worker.sig_finished, timeout=10_000):
        window.controller.delete_conversation(doomed)
    assert store.conversation(doomed) is None
    assert window.controller.conversation.id != doomed
    assert window.chat_view.send_button.isEnabled()


def test_first_run_on_the_demo_model_without_a_gpu_says_what_a_gpu_would_add(
        qtbot, make_window, tmp_path):
    import json

    from app.paths import DEMO_MODEL_DIR

    lines = (Path(__file__).parent / "recordings" / "load.jsonl").read_text().splitlines()
    loaded = json.loads(lines[-1])
    loaded["model"] = str(DEMO_MODEL_DIR)
    recording = tmp_path / "load_demo.jsonl"
    recording.write_text("\n".join([*lines[:-1], json.dumps(loaded)]) + "\n")
    window = make_window(HEARTH_FAKE_LOAD=str(recording))
    assert "demo model on the CPU" in window.notice.text
    assert "GPU" in window.notice.text and window.notice.isVisible()
    other = make_window()  # a model of the user's own: no such notice
    assert "demo model" not in other.notice.text
