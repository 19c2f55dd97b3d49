"""A conversation's output schema and a model's thinking, through the real widgets and the real
worker (python -m engine.cli.worker) on the tiny model that thinks (tests/fixtures/tool_model.py:
its answers are fixed by its weights; under a schema the grammar writes the JSON): a schema that
is not one is refused in the settings with one line; an answer under a schema is valid JSON
against it, shown indented; one that the grammar engine cannot compile ends in one error line
and the chat goes on; the thinking is folded under its words and seconds, kept in the store,
and the Think toggle turns it off."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from PySide6.QtCore import QCoreApplication, QEvent, Qt

from app.chat.conversation_settings_dialog import ConversationSettingsDialog
from app.history.conversation import ChatSettings, Conversation
from app.main_window import MainWindow
from app.worker.worker_client import WorkerClient
from engine.events import LoadRequest
from tests.fixtures import tool_model

pytest.importorskip("torch")  # the worker's side; the app itself never imports it

SCHEMA = {"type": "object", "properties": {
    "ok": {"type": "boolean"}, "color": {"enum": ["red", "green"]}},
    "required": ["ok", "color"], "additionalProperties": False}
ANSWER = tool_model.THINKING_ANSWER.split("</think>", 1)[1]  # the content after the thinking


@pytest.fixture(scope="module")
def thinking_model(tiny_models, tmp_path_factory):
    return tool_model.build(tiny_models["llama"], tmp_path_factory.mktemp("think") / "m")


@pytest.fixture
def window(qtbot, store, settings, thinking_model):
    window = MainWindow(store, WorkerClient(), settings)
    window.show()
    qtbot.waitActive(window)
    with qtbot.waitSignal(window.worker.sig_loaded, timeout=120_000):
        window.start(LoadRequest(model=str(thinking_model), device="cpu", context=256))
    yield window
    window.worker.kill()
    window.close()
    window.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


def send(qtbot, window, text: str):
    """Type, click Send (a closed dialog may leave no window active for the keys), wait for
    the answer's end -> its message view."""
    chat = window.chat_view
    chat.input.setPlainText(text)
    assert chat.send_button.isEnabled(), chat.wait_label.text()
    with qtbot.waitSignal(window.controller.sig_generating_changed, timeout=60_000,
                          check_params_cb=lambda is_on: not is_on):
        qtbot.mouseClick(chat.send_button, Qt.MouseButton.LeftButton)
    answer = window.controller.messages()[-1]
    return answer, chat.message_views[answer.id]


def set_schema(window, text: str) -> ConversationSettingsDialog:
    dialog = window.open_conversation_settings(window.controller.conversation.id)
    dialog.schema_edit.setPlainText(text)
    dialog.accept()
    return dialog


def test_a_schema_that_is_not_one_is_refused_in_the_settings(qtbot, tmp_path):
    dialog = ConversationSettingsDialog(Conversation(1, "t", ChatSettings(), 0))
    qtbot.addWidget(dialog)
    dialog.open()
    dialog.schema_edit.setPlainText('{"type": "object",')
    dialog.accept()
    assert dialog.isVisible() and dialog.result() != dialog.DialogCode.Accepted
    assert dialog.schema_error_label.isVisibleTo(dialog)
    assert dialog.schema_error_label.text().startswith("The output schema is not valid JSON")
    dialog.schema_edit.setPlainText("[1, 2]")
    dialog.accept()
    assert "a JSON schema is an object" in dialog.schema_error_label.text()
    (tmp_path / "broken.json").write_text("{nope")
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    assert not dialog.load_schema(str(tmp_path / "missing.json"))
    assert dialog.schema_error_label.text().startswith("Cannot read missing.json")
    assert not dialog.load_schema(str(tmp_path / "broken.json"))
    assert dialog.schema_error_label.text().startswith("Broken.json: the output schema is "
                                                       "not valid JSON")
    assert dialog.load_schema(str(tmp_path / "schema.json"))
    assert not dialog.schema_error_label.isVisibleTo(dialog)
    dialog.accept()
    assert dialog.result() == dialog.DialogCode.Accepted
    assert json.loads(dialog.settings().output_schema) == SCHEMA


def test_folded_thinking_the_think_toggle_and_answers_under_a_schema(qtbot, window, store):
    """One worker for all of it (a start and a load are most of the time)."""
    chat = window.chat_view
    assert chat.think_box.isVisibleTo(chat) and chat.think_box.isEnabled()
    assert chat.think_box.isChecked()
    answer, view = send(qtbot, window, "Weather in Paris?")
    assert (answer.reasoning, answer.content) == (tool_model.THINKING, ANSWER)
    kept = store.message(answer.id)
    assert (kept.reasoning, kept.content) == (tool_model.THINKING, ANSWER)
    assert kept.thinking_s is not None and kept.thinking_s >= 0
    assert re.fullmatch(r"Thought for \d+\.\d s \(2 words\)", view.think_button.text())
    assert not view.reasoning_view.isVisibleTo(view)
    assert view.answer_view.markdown == ANSWER
    view.think_button.click()
    assert view.reasoning_view.toPlainText() == tool_model.THINKING
    chat.think_box.click()  # off: kept with the conversation, sent as enable_thinking false
    assert window.controller.conversation.settings.think is False
    answer, view = send(qtbot, window, "And now?")
    assert (answer.reasoning, answer.content) == ("", tool_model.PLAIN_ANSWER)
    assert not view.think_button.isVisibleTo(view)

    set_schema(window, json.dumps(SCHEMA))
    assert json.loads(window.controller.conversation.settings.output_schema) == SCHEMA
    answer, view = send(qtbot, window, "Is it fine?")
    assert answer.status == "done" and answer.finish_reason == "eos" and answer.is_json
    value = json.loads(answer.content)
    jsonschema.validate(value, SCHEMA)
    assert view.answer_view.code_blocks == [json.dumps(value, indent=2)]
    # a schema the grammar engine cannot compile: one line under the answer, the chat goes on
    set_schema(window, '{"type": "nonsense"}')
    answer, view = send(qtbot, window, "Again?")
    assert answer.status == "failed" and "does not compile" in answer.error
    assert view.error_label.isVisibleTo(view) and "\n" not in view.error_label.text()
    set_schema(window, "")
    answer, _ = send(qtbot, window, "And the weather?")
    assert answer.status == "done" and not answer.is_json
    assert store.message(answer.id).content == tool_model.PLAIN_ANSWER
