"""The chat follows its answer when the conversation is taller than the view: the question just
sent comes into view, a streaming answer keeps its last line in view while the view is at the
bottom, a user who scrolled up is left where they are, and "Jump to latest" brings the view
back to the bottom (and following resumes)."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect

from engine.events import LoadRequest

GENERATION_TIMEOUT_MS = 30_000
LONG = "20"  # the recorded answer this many times over: far taller than the view
ENDLESS = "400"  # an answer still streaming whenever the test looks; stopped at the end
SLOW_S = "0.005"  # between two events, so that an answer streams for a while


def ended(qtbot, window):
    return qtbot.waitSignal(window.controller.sig_generating_changed,
                            timeout=GENERATION_TIMEOUT_MS, check_params_cb=lambda on: not on)


def in_view(area, widget) -> QRect:
    """The part of `widget` the scroll area's view shows (empty: none of it)."""
    viewport = area.viewport()
    return viewport.rect() & QRect(widget.mapTo(viewport, QPoint(0, 0)), widget.size())


def last_line_in_view(area, widget) -> bool:
    bottom = widget.mapTo(area.viewport(), QPoint(0, widget.height() - 1)).y()
    return 0 <= bottom < area.viewport().height()


def short_window(make_window, **env):
    window = make_window(**env)
    window.resize(1000, 520)
    return window


def send(window, text: str) -> None:
    window.chat_view.input.setPlainText(text)
    window.chat_view.send_button.click()


def newest(window, role: str):
    return [v for v in window.chat_view.message_views.values() if v.message.role == role][-1]


def test_a_long_answer_streamed_into_a_short_view_ends_with_its_last_line_visible(
        qtbot, make_window):
    window = short_window(make_window, HEARTH_FAKE_REPEAT=LONG)
    area = window.chat_view.scroll_area
    bar = area.verticalScrollBar()

    def ask(question: str) -> None:
        with ended(qtbot, window):
            send(window, question)
        answer = newest(window, "assistant")
        qtbot.waitUntil(lambda: answer.answer_view.markdown.endswith("**done**."))
        assert bar.maximum() > area.viewport().height()  # taller than the view, by far
        # once laid out, the view is at the bottom with the answer's last line in it
        qtbot.waitUntil(lambda: bar.value() == bar.maximum() > 0
                        and last_line_in_view(area, answer.answer_view))
        assert last_line_in_view(area, answer) and area.jump_button.isHidden()

    ask("A first long answer, please")
    ask("And another one")  # the conversation was taller than the view before it too


def test_the_question_just_sent_is_scrolled_into_view(qtbot, make_window):
    window = short_window(make_window, HEARTH_FAKE_REPEAT=LONG)
    area = window.chat_view.scroll_area
    with ended(qtbot, window):
        send(window, "A first long answer, please")
    area.verticalScrollBar().setValue(0)  # the user reads the conversation from its start
    window.worker.extra_env.update(HEARTH_FAKE_DELAY_S=SLOW_S)
    window.worker.kill()  # the next worker streams slowly: the question is seen before the end
    with qtbot.waitSignal(window.worker.sig_loaded, timeout=GENERATION_TIMEOUT_MS):
        window.load(LoadRequest())
    with ended(qtbot, window):
        send(window, "What is the capital of France?")
        question = newest(window, "user")
        qtbot.waitUntil(lambda: in_view(area, question).height() == question.height())
    qtbot.waitUntil(lambda: last_line_in_view(area, newest(window, "assistant").answer_view))


def test_a_user_scrolled_up_is_not_moved_and_jump_to_latest_brings_the_bottom_back(
        qtbot, make_window):
    window = short_window(make_window, HEARTH_FAKE_REPEAT=ENDLESS, HEARTH_FAKE_DELAY_S=SLOW_S)
    area, controller = window.chat_view.scroll_area, window.controller
    bar = area.verticalScrollBar()
    send(window, "An endless answer, please")
    qtbot.waitUntil(lambda: bar.maximum() > 2 * area.viewport().height(),
                    timeout=GENERATION_TIMEOUT_MS)
    assert controller.is_generating and bar.value() == bar.maximum()  # followed so far
    bar.setValue(bar.maximum() // 2)  # the user scrolls up to read
    where, height = bar.value(), bar.maximum()
    qtbot.waitUntil(lambda: bar.maximum() > height + area.viewport().height(),
                    timeout=GENERATION_TIMEOUT_MS)
    assert controller.is_generating and bar.value() == where  # left where the user put it
    assert not area.is_following and area.jump_button.isVisible()
    assert area.viewport().geometry().contains(area.jump_button.geometry())  # over the view

    area.jump_button.click()
    assert bar.value() == bar.maximum() and area.jump_button.isHidden()
    height = bar.maximum()
    qtbot.waitUntil(lambda: bar.maximum() > height + area.viewport().height(),
                    timeout=GENERATION_TIMEOUT_MS)
    assert bar.value() == bar.maximum() and area.is_following  # following again
    with ended(qtbot, window):
        controller.stop()
    qtbot.waitUntil(lambda: bar.value() == bar.maximum()
                    and last_line_in_view(area, newest(window, "assistant").answer_view))
