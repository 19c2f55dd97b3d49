"""Reasoning split and Markdown rendering of one message."""

from __future__ import annotations

from app.chat.code_highlighter import is_code_block
from app.chat.message_view import MessageView
from app.chat.think_split import answer_only, split_think
from app.history.conversation import Message


def test_split_think():
    s = split_think("<think>\nweigh it\n</think>\n\nThe answer.")
    assert (s.reasoning, s.answer, s.is_thinking) == ("weigh it", "The answer.", False)
    s = split_think("<think>\nstill going")
    assert (s.reasoning, s.answer, s.is_thinking) == ("still going", "", True)
    s = split_think("the template opened it</think>Answer")  # Qwen3 templates open <think>
    assert (s.reasoning, s.answer) == ("the template opened it", "Answer")
    assert split_think("<thi").answer == ""  # a tag arriving token by token is not shown
    assert split_think("no tags").answer == "no tags"
    assert answer_only("<think>x</think>y") == "y"


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
