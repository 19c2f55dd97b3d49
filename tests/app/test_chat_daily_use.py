"""The chat as a daily user meets it: Enter sends (or Ctrl+Enter, a setting), the welcome screen
of an empty conversation, answer alternatives with their switcher (kept across a restart), the
greedy-regenerate offer, the facts under each answer, a copy button on each code block, the
title following the first message (cut at a word), and why Send waits while another chat is
answered."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QGuiApplication

from app.app_settings import AppSettings
from app.chat.chat_controller import SAMPLING_TEMPERATURE
from app.chat.welcome_view import SUGGESTED_PROMPTS
from app.history.conversation import MAX_TITLE_CHARS, ChatSettings
from app.history.conversation_store import ConversationStore
from engine.events import GenerateRequest
from tests.app.conftest import recorded_text

HELLO_TEXT = recorded_text("generate_hello.jsonl")


def ended(qtbot, window):
    return qtbot.waitSignal(window.controller.sig_generating_changed, timeout=10_000,
                            check_params_cb=lambda is_on: not is_on)


def generates(fake_log) -> list[GenerateRequest]:
    return [r for r in fake_log() if isinstance(r, GenerateRequest)]


def test_enter_sends_and_shift_enter_starts_a_new_line(qtbot, make_window, store, fake_log):
    window = make_window()
    chat = window.chat_view
    assert "Enter to send, Shift+Enter for a new line" in chat.input.placeholderText()
    qtbot.keyClicks(chat.input, "first line")
    qtbot.keyClick(chat.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(chat.input, "second line")
    assert chat.input.toPlainText() == "first line\nsecond line"  # a plain \n, not U+2028
    assert generates(fake_log) == []
    with ended(qtbot, window):
        qtbot.keyClick(chat.input, Qt.Key.Key_Return)
    [request] = generates(fake_log)
    assert request.messages == ({"role": "user", "content": "first line\nsecond line"},)
    assert chat.input.toPlainText() == ""
    with ended(qtbot, window):  # the keypad's Enter too
        chat.input.setPlainText("again")
        qtbot.keyClick(chat.input, Qt.Key.Key_Enter, Qt.KeyboardModifier.KeypadModifier)
    assert len(generates(fake_log)) == 2


def test_the_ctrl_enter_setting_keeps_enter_for_new_lines(qtbot, make_window, settings,
                                                         fake_log):
    window = make_window()
    chat = window.chat_view
    [action] = [a for a in window.menuBar().actions()[0].menu().actions()
                if a.text() == "Send with Ctrl+Enter"]
    action.trigger()
    assert settings.sends_on_ctrl_enter()
    assert "Ctrl+Enter to send" in chat.input.placeholderText()
    qtbot.keyClicks(chat.input, "one")
    qtbot.keyClick(chat.input, Qt.Key.Key_Return)
    qtbot.keyClicks(chat.input, "two")
    assert chat.input.toPlainText() == "one\ntwo" and generates(fake_log) == []
    with ended(qtbot, window):
        qtbot.keyClick(chat.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert generates(fake_log)[0].messages[0]["content"] == "one\ntwo"
    # remembered: the next window sends on Ctrl+Enter too
    again = AppSettings(QSettings(settings.q.fileName(), QSettings.Format.IniFormat))
    assert again.sends_on_ctrl_enter()


def test_an_empty_conversation_shows_the_welcome_screen(qtbot, make_window, fake_log):
    window = make_window()
    chat = window.chat_view
    welcome = chat.welcome
    assert chat.pages.currentWidget() is welcome
    assert "demo-qwen2-tiny" in welcome.model_label.text()
    assert "bf16" in welcome.model_label.text() and "2,048 tokens" in welcome.model_label.text()
    assert "runs on the CPU" in welcome.device_label.text()
    assert [b.text() for b in welcome.prompt_buttons] == list(SUGGESTED_PROMPTS)
    assert len(SUGGESTED_PROMPTS) == 4
    assert not welcome.get_model_button.isVisibleTo(welcome)  # not the bundled demo model
    with ended(qtbot, window):
        welcome.prompt_buttons[1].click()
    assert generates(fake_log)[0].messages[0]["content"] == SUGGESTED_PROMPTS[1]
    assert chat.pages.currentWidget() is chat.scroll_area
    window.controller.new_conversation()
    assert chat.pages.currentWidget() is welcome


def test_on_the_demo_model_the_welcome_screen_leads_to_a_real_one(qtbot, make_window,
                                                                  tmp_path):
    from tests.app.test_window_chrome import demo_load_recording

    window = make_window(HEARTH_FAKE_LOAD=str(demo_load_recording(tmp_path)))
    welcome = window.chat_view.welcome
    assert "the demo model" in welcome.model_label.text()
    assert welcome.get_model_button.isVisibleTo(welcome)
    assert welcome.demo_label.isVisibleTo(welcome)
    welcome.get_model_button.click()
    assert window.picker is not None and window.picker.isVisible()
    assert window.picker.focusWidget() is window.picker.get_model_panel.repo_edit
    window.picker.reject()


def test_regenerate_keeps_the_earlier_answer_as_an_alternative(qtbot, make_window, store,
                                                               fake_log, tmp_path):
    window = make_window()
    chat = window.chat_view
    with ended(qtbot, window):
        chat.input.setPlainText("name a colour")
        chat.send_button.click()
    cid = window.controller.conversation.id
    first = store.messages(cid)[-1]
    store.finish_message(first.id, "red", "done", "eos")  # tell the two apart
    window.controller.show_conversation(cid)
    with ended(qtbot, window):
        chat.regenerate_button.click()
    user, second = store.messages(cid)
    assert second.id != first.id and second.content == HELLO_TEXT
    assert (second.alternative, second.num_alternatives) == (2, 2)
    view = chat.message_views[second.id]
    assert view.alternative_label.text() == "2/2" and view.alternative_label.isVisibleTo(view)
    assert view.previous_button.isEnabled() and not view.next_button.isEnabled()
    first_request, second_request = generates(fake_log)
    assert second_request.messages == first_request.messages == (
        {"role": "user", "content": "name a colour"},)

    view.previous_button.click()  # < : back to "red"
    assert [m.content for m in store.messages(cid)] == ["name a colour", "red"]
    view = chat.message_views[first.id]
    assert view.alternative_label.text() == "1/2" and view.answer_view.toPlainText() == "red"
    with ended(qtbot, window):  # the conversation goes on from the answer shown
        chat.input.setPlainText("why?")
        chat.send_button.click()
    assert generates(fake_log)[-1].messages == (
        {"role": "user", "content": "name a colour"}, {"role": "assistant", "content": "red"},
        {"role": "user", "content": "why?"})
    shown = [m.id for m in store.messages(cid)]

    # a restart (a new store on the same file) shows the same branch and keeps both answers
    again = ConversationStore(store.path)
    assert [m.id for m in again.messages(cid)] == shown
    assert again.alternatives(first.id) == [first.id, second.id]
    again.show_alternative(second.id)
    assert [m.content for m in again.messages(cid)] == ["name a colour", HELLO_TEXT]
    again.close()


def test_a_greedy_regenerate_says_it_would_repeat_and_offers_sampling(qtbot, make_window,
                                                                      store, fake_log):
    window = make_window()
    chat, controller = window.chat_view, window.controller
    controller.update_settings(controller.conversation.id,
                               ChatSettings(temperature=0.0, top_k=40))
    with ended(qtbot, window):
        chat.input.setPlainText("hi")
        chat.send_button.click()
    chat.regenerate_button.click()
    assert chat.greedy_banner.isVisibleTo(chat) and "greedy" in chat.greedy_label.text()
    # loaded without the reproducible mode: "nearly the same", not a promise it cannot keep
    assert "nearly the same, not always exactly" in chat.greedy_label.text()
    assert len(generates(fake_log)) == 1  # nothing sent yet
    with ended(qtbot, window):
        chat.sampling_button.click()
    request = generates(fake_log)[-1]
    assert request.sampling.temperature == SAMPLING_TEMPERATURE and request.sampling.seed is None
    assert request.sampling.top_k == 40  # the rest of the settings stay
    assert not chat.greedy_banner.isVisibleTo(chat)
    assert store.conversation(controller.conversation.id).settings.temperature == 0.0
    chat.regenerate_button.click()
    with ended(qtbot, window):
        chat.anyway_button.click()
    assert generates(fake_log)[-1].sampling.temperature == 0.0
    assert store.messages(controller.conversation.id)[-1].num_alternatives == 3
    controller.loaded = replace(controller.loaded, config={"reproducible": True})
    chat.regenerate_button.click()
    assert chat.greedy_label.text().endswith("would come out the same.")  # the mode: exact


def test_each_answer_shows_its_facts_and_each_code_block_a_copy_button(qtbot, make_window,
                                                                       store):
    window = make_window()
    with ended(qtbot, window):
        window.chat_view.input.setPlainText("Write me some code")
        window.chat_view.send_button.click()
    answer = store.messages(window.controller.conversation.id)[-1]
    view = window.chat_view.message_views[answer.id]
    s = answer.stats
    facts = view.facts_label.text()
    assert facts.startswith(f"{s.new_tokens:,} tokens · {s.decode_tokens_per_s:.1f} tokens/s · "
                            f"first token {s.ttft_ms:.0f} ms")
    assert facts.endswith("ended by the model") and view.facts_label.isVisibleTo(view)
    user_view = window.chat_view.message_views[store.messages(answer.conversation_id)[0].id]
    assert not user_view.facts_label.isVisibleTo(user_view)
    markdown = view.answer_view
    code = "def add(a, b):\n    return a + b  # sum"
    assert markdown.code_blocks == [code]
    [button] = [b for b in markdown.copy_buttons if b.isVisibleTo(markdown)]
    button.click()
    assert QGuiApplication.clipboard().text() == code
    assert button.text() == "Copied"


def test_the_title_follows_the_first_message_and_its_edits(qtbot, make_window, store):
    window = make_window()
    chat, controller = window.chat_view, window.controller
    with ended(qtbot, window):
        chat.input.setPlainText("How do   I bake bread?")
        chat.send_button.click()
    cid = controller.conversation.id
    assert store.conversation(cid).title == "How do I bake bread?"
    first = store.messages(cid)[0]
    with ended(qtbot, window):
        assert controller.edit_and_resend(first.id, "How do I bake sourdough bread?")
    assert store.conversation(cid).title == "How do I bake sourdough bread?"
    assert chat.title_label.text() == "How do I bake sourdough bread?"
    controller.rename_conversation(cid, "Baking")  # the user's own title stays
    with ended(qtbot, window):
        assert controller.edit_and_resend(first.id, "How do I bake rye bread?")
    assert store.conversation(cid).title == "Baking"


def test_a_long_first_message_makes_a_title_cut_at_a_word_boundary(qtbot, make_window, store):
    window = make_window()
    question = ("How do I keep a sourdough starter alive through a long summer holiday "
                "without a fridge?")
    with ended(qtbot, window):
        window.chat_view.input.setPlainText(question)
        window.chat_view.send_button.click()
    title = store.conversation(window.controller.conversation.id).title
    assert title.endswith("\u2026") and len(title) <= MAX_TITLE_CHARS
    words = title.removesuffix("\u2026").split(" ")
    assert words == question.split(" ")[:len(words)]  # whole words only, none cut
    assert window.chat_view.title_label.text() == title
    assert window.conversation_list.list.currentItem().text() == title


def test_send_in_another_chat_while_one_is_answered_says_why_it_waits(qtbot, make_window):
    window = make_window(HEARTH_FAKE_DELAY_S="0.05")
    chat, controller = window.chat_view, window.controller
    chat.input.setPlainText("tell me a story")
    with qtbot.waitSignal(window.worker.sig_token, timeout=10_000):
        chat.send_button.click()
    controller.rename_conversation(controller.conversation.id, "Story time")
    controller.new_conversation()
    assert not chat.send_button.isEnabled()
    assert chat.wait_label.isVisibleTo(chat)
    assert "answering in \u201cStory time\u201d" in chat.wait_label.text()
    assert chat.send_button.toolTip() == chat.wait_label.text()
    with ended(qtbot, window):
        pass
    assert chat.send_button.isEnabled() and chat.wait_label.text() == ""


def test_a_greedy_regenerate_of_a_stopped_answer_goes_ahead(qtbot, make_window, store,
                                                            fake_log):
    window = make_window(HEARTH_FAKE_DELAY_S="0.05")
    chat, controller = window.chat_view, window.controller
    controller.update_settings(controller.conversation.id, ChatSettings(temperature=0.0))
    chat.input.setPlainText("hi")
    with qtbot.waitSignal(window.worker.sig_token, timeout=10_000):
        chat.send_button.click()
    with ended(qtbot, window):
        controller.stop()
    assert store.messages(controller.conversation.id)[-1].status == "cancelled"
    with ended(qtbot, window):  # it would not repeat: the stopped one ended early
        chat.regenerate_button.click()
    assert not chat.greedy_banner.isVisibleTo(chat) and len(generates(fake_log)) == 2
