"""Reasoning split and Markdown rendering of one message."""

from __future__ import annotations

from app.chat.code_highlighter import is_code_block
from app.chat.message_view import MessageView
from app.history.conversation import Message


def test_the_thinking_folds_under_its_length_and_time(qtbot):
    view = MessageView(Message(1, 1, "assistant", "", "streaming", reasoning="weigh it"))
    qtbot.addWidget(view)
    assert view.think_button.isVisibleTo(view) and view.think_button.text() == "Thinking…"
    view.set_message(Message(1, 1, "assistant", "The answer.", "done", reasoning="weigh it",
                             thinking_s=2.25))
    assert view.think_button.text() == "Thought for 2.2 s (2 words)"
    assert not view.reasoning_view.isVisibleTo(view)
    assert view.answer_view.toPlainText() == "The answer."
    view.think_button.click()
    assert view.reasoning_view.toPlainText() == "weigh it"


def test_an_answer_under_a_schema_shows_as_indented_json(qtbot):
    view = MessageView(Message(1, 1, "assistant", '{"a":[1,"``` x"]}', is_json=True))
    qtbot.addWidget(view)
    assert view.answer_view.code_blocks == ['{\n  "a": [\n    1,\n    "``` x"\n  ]\n}']
    view.set_message(Message(1, 1, "assistant", '{"a":[1,', "done", is_json=True))
    assert view.answer_view.code_blocks == ['{"a":[1,']  # cut: shown as it came


def test_code_blocks_are_highlighted(qtbot):
    text = "Look:\n\n```python\ndef f():\n    return 'x'  # note\n```\n"
    view = MessageView(Message(1, 1, "assistant", text))
    qtbot.addWidget(view)
    doc = view.answer_view.document()
    blocks = [doc.findBlockByNumber(i) for i in range(doc.blockCount())]
    code = [b for b in blocks if is_code_block(b)]
    assert [b.text() for b in code] == ["def f():", "    return 'x'  # note"]
    assert all(b.layout().formats() for b in code)  # keyword, string, comment colours
    assert not any(b.layout().formats() for b in blocks if not is_code_block(b))


def test_streaming_renders_are_throttled(qtbot):
    view = MessageView(Message(1, 1, "assistant", "", "streaming"))
    qtbot.addWidget(view)
    for i in range(50):
        view.set_message(Message(1, 1, "assistant", "word " * i, "streaming"))
    assert view.answer_view.markdown == ""  # not yet: the render timer has not fired
    qtbot.waitUntil(lambda: view.answer_view.markdown == "word " * 49, timeout=1_000)
    view.set_message(Message(1, 1, "assistant", "final", "done"))
    assert view.answer_view.markdown == "final"  # a finished message renders at once
