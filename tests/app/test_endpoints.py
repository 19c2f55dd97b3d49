"""Remote engines in the window, against the fake OpenAI-compatible endpoint: the picker's
"Add endpoint…" and its models, the chat streaming from one (stop, regenerate, edit and resend,
saved answers), the performance panel, every failure calm, and API keys kept out of the
database, the settings and the log (their bytes grepped)."""

from __future__ import annotations

import logging

import keyring
import keyring.backend
import keyring.backends.fail
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox

from app.log_file import setup_logging
from app.models.model_picker_dialog import ENTRY_ROLE, ModelPickerDialog
from app.remote.endpoint_keys import SERVICE, EndpointKeys
from app.remote.endpoints import EndpointModel
from app.worker.performance_panel import PerformancePanel
from tests.fake_endpoint import ANSWER, FakeEndpoint, closed_port_url

KEY = "sk-hearth-test-7f3a9c2e5b1d4a60"
ANSWER_TEXT = "".join(ANSWER)


class MemoryKeyring(keyring.backend.KeyringBackend):
    """A keyring in a dict: what the system keyring would hold, inspectable."""

    priority = 1

    def __init__(self) -> None:
        super().__init__()
        self.secrets: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        return self.secrets.get((service, username))

    def set_password(self, service, username, password):
        self.secrets[(service, username)] = password

    def delete_password(self, service, username):
        self.secrets.pop((service, username), None)


@pytest.fixture
def memory_keyring():
    before = keyring.get_keyring()
    ring = MemoryKeyring()
    keyring.set_keyring(ring)
    yield ring
    keyring.set_keyring(before)


@pytest.fixture
def no_keyring():
    before = keyring.get_keyring()
    keyring.set_keyring(keyring.backends.fail.Keyring())
    yield
    keyring.set_keyring(before)


@pytest.fixture
def fake():
    with FakeEndpoint(api_key=KEY, contexts={"fake-7b": 8192}) as endpoint:
        yield endpoint


def model_item(panel, model: str):
    for i in range(panel.tree.topLevelItemCount()):
        top = panel.tree.topLevelItem(i)
        for j in range(top.childCount()):
            choice = top.child(j).data(0, Qt.ItemDataRole.UserRole)
            if choice is not None and choice.model == model:
                return top.child(j)
    return None


def tree_texts(panel) -> list[str]:
    texts = []
    for i in range(panel.tree.topLevelItemCount()):
        top = panel.tree.topLevelItem(i)
        texts += [top.text(0)] + [top.child(j).text(0) for j in range(top.childCount())]
    return texts


def add_endpoint(qtbot, panel, url: str, key: str | None) -> None:
    """Through the dialog, as a user would: the button, the two fields, OK."""
    qtbot.mouseClick(panel.add_button, Qt.MouseButton.LeftButton)
    dialog = panel.dialog
    assert dialog.key_edit.echoMode() == dialog.key_edit.EchoMode.Password
    dialog.url_edit.setText(url)
    dialog.key_edit.setText(key or "")
    dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    qtbot.waitUntil(lambda: not any("Listing" in t for t in tree_texts(panel)), timeout=10_000)


def use_endpoint(qtbot, window, fake, key: str | None = KEY, model: str = "fake-7b") -> None:
    window.open_model_picker()
    picker = window.picker
    add_endpoint(qtbot, picker.endpoint_panel, fake.base_url, key)
    picker.endpoint_panel.tree.setCurrentItem(model_item(picker.endpoint_panel, model))
    assert picker.load_button.isEnabled()
    with qtbot.waitSignal(window.endpoint_client.sig_loaded, timeout=10_000):
        picker.accept()


def send(qtbot, window, text: str) -> None:
    chat = window.chat_view
    chat.input.setPlainText(text)
    with qtbot.waitSignal(window.controller.sig_generating_changed, timeout=10_000,
                          check_params_cb=lambda is_on: not is_on):
        qtbot.mouseClick(chat.send_button, Qt.MouseButton.LeftButton)


def last_answer(store, window):
    return store.messages(window.controller.conversation.id)[-1]


# ---------------------------------------------------------------- the picker


def test_the_picker_lists_an_endpoints_models_with_its_key_masked(qtbot, settings, fake,
                                                                  memory_keyring):
    picker = ModelPickerDialog(settings, endpoint_keys=EndpointKeys())
    qtbot.addWidget(picker)
    panel = picker.endpoint_panel
    add_endpoint(qtbot, panel, fake.base_url, KEY)

    texts = tree_texts(panel)
    assert any("fake-7b  (8,192 tokens)" == t for t in texts) and "fake-70b" in texts
    assert not any(KEY in t for t in texts) and any("••••" + KEY[-4:] in t for t in texts)
    assert memory_keyring.secrets == {(SERVICE, fake.base_url): KEY}
    assert settings.endpoints() == [fake.base_url]

    panel.tree.setCurrentItem(model_item(panel, "fake-70b"))
    assert picker.remote_choice() == EndpointModel(fake.base_url, "fake-70b", 0)
    assert picker.load_request() is None and picker.load_button.isEnabled()
    assert "runs on the endpoint at 127.0.0.1" in picker.fit_panel.summary_label.text()

    picker.model_list.setCurrentRow(0)  # a local model after all
    assert picker.remote_choice() is None and picker.load_request() is not None
    assert picker.model_list.currentItem().data(ENTRY_ROLE) is not None

    # the next picker lists it again, its key from the keyring
    again = ModelPickerDialog(settings, endpoint_keys=EndpointKeys())
    qtbot.addWidget(again)
    qtbot.waitUntil(lambda: model_item(again.endpoint_panel, "fake-7b") is not None)
    again.endpoint_panel.tree.setCurrentItem(model_item(again.endpoint_panel, "fake-7b"))
    qtbot.mouseClick(again.endpoint_panel.remove_button, Qt.MouseButton.LeftButton)
    assert settings.endpoints() == [] and memory_keyring.secrets == {}


@pytest.mark.parametrize("where, key, words", [
    ("closed", KEY, "Cannot reach the endpoint"),
    ("fake", "sk-wrong-key-000000000000", "refused the API key"),
    ("fake", None, "needs an API key"),
])
def test_an_endpoint_that_cannot_be_listed_says_why(qtbot, settings, fake, memory_keyring,
                                                    where, key, words):
    picker = ModelPickerDialog(settings, endpoint_keys=EndpointKeys())
    qtbot.addWidget(picker)
    url = closed_port_url() if where == "closed" else fake.base_url
    add_endpoint(qtbot, picker.endpoint_panel, url, key)
    texts = tree_texts(picker.endpoint_panel)
    assert any(t.startswith("Could not list its models") and words in t for t in texts), texts
    assert not any(key and key in t for t in texts)
    assert picker.remote_choice() is None


def test_a_bad_url_is_refused_in_the_dialog(qtbot, settings, memory_keyring):
    picker = ModelPickerDialog(settings, endpoint_keys=EndpointKeys())
    qtbot.addWidget(picker)
    panel = picker.endpoint_panel
    qtbot.mouseClick(panel.add_button, Qt.MouseButton.LeftButton)
    panel.dialog.url_edit.setText("http://me:sk-secret@host/v1")
    panel.dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert panel.dialog.isVisible() and "own field" in panel.dialog.error_label.text()
    assert settings.endpoints() == []


# ---------------------------------------------------------------- the chat


def test_the_chat_streams_from_the_endpoint(qtbot, make_window, store, fake, memory_keyring):
    window = make_window()
    use_endpoint(qtbot, window, fake)
    assert not window.worker.is_running  # the local model's VRAM is given back
    assert "fake-7b · on the endpoint at 127.0.0.1" in window.model_status.label.text()

    send(qtbot, window, "Hello there")
    answer = last_answer(store, window)
    assert (answer.content, answer.status, answer.finish_reason) == (ANSWER_TEXT, "done", "eos")
    assert answer.stats.new_tokens == len(ANSWER) and answer.stats.ttft_ms > 0
    assert window.chat_view.message_views[answer.id].answer_view.markdown == ANSWER_TEXT
    assert window.chat_view.context_label.text().startswith("Context 1")
    assert fake.chat_requests[-1]["messages"] == [{"role": "user", "content": "Hello there"}]

    panel = window.performance_panel  # no VRAM chart: time to first token, and where
    assert panel.vram_plot.isHidden() and not panel.ttft_plot.isHidden()
    assert "on 127.0.0.1" in panel.latency_label.text()
    assert "runs on the endpoint at 127.0.0.1" in panel.vram_note.text()
    assert panel.ttft.size > 0 and panel.speed.size > 0

    with qtbot.waitSignal(window.controller.sig_generating_changed, timeout=10_000,
                          check_params_cb=lambda is_on: not is_on):
        assert window.controller.regenerate()
    messages = store.messages(window.controller.conversation.id)
    assert [m.role for m in messages] == ["user", "assistant"] and len(fake.chat_requests) == 2

    with qtbot.waitSignal(window.controller.sig_generating_changed, timeout=10_000,
                          check_params_cb=lambda is_on: not is_on):
        assert window.controller.edit_and_resend(messages[0].id, "Hello again")
    assert fake.chat_requests[-1]["messages"] == [{"role": "user", "content": "Hello again"}]
    assert last_answer(store, window).content == ANSWER_TEXT


def test_stop_ends_an_endpoint_answer_and_keeps_it(qtbot, make_window, store, fake,
                                                   memory_keyring):
    window = make_window()
    use_endpoint(qtbot, window, fake)
    fake.delay_s = 0.1
    window.chat_view.input.setPlainText("Tell me a story")
    with qtbot.waitSignal(window.endpoint_client.sig_token, timeout=10_000):
        qtbot.mouseClick(window.chat_view.send_button, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(window.controller.sig_generating_changed, timeout=5_000):
        qtbot.mouseClick(window.chat_view.stop_button, Qt.MouseButton.LeftButton)
    answer = last_answer(store, window)
    assert (answer.status, answer.finish_reason) == ("cancelled", "cancelled")
    assert answer.content and len(answer.content) < len(ANSWER_TEXT)
    assert window.controller.can_send


def test_a_stalled_endpoint_stops_at_once(qtbot, make_window, store, fake, memory_keyring):
    window = make_window()
    use_endpoint(qtbot, window, fake)
    fake.mode = "stall"
    window.chat_view.input.setPlainText("anyone there?")
    qtbot.mouseClick(window.chat_view.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(fake.chat_requests) == 1)
    with qtbot.waitSignal(window.controller.sig_generating_changed, timeout=2_000):
        window.controller.stop()
    assert last_answer(store, window).status == "cancelled"


@pytest.mark.parametrize("failure, words, partial", [
    ("cut", "was cut mid-answer", "Hello! I"),
    ("error_chunk", "reported an error mid-answer: CUDA out of memory", "Hello! I"),
    ("vanished", "does not serve the model fake-7b", ""),
    ("new_key", "refused the API key", ""),
    ("down", "Cannot reach the endpoint", ""),
])
def test_a_failure_is_one_calm_message_and_the_chat_goes_on(qtbot, make_window, store, fake,
                                                           memory_keyring, failure, words,
                                                           partial):
    window = make_window()
    use_endpoint(qtbot, window, fake)
    send(qtbot, window, "first")
    if failure in ("cut", "error_chunk"):
        fake.mode, fake.fail_after = failure, 3
    elif failure == "vanished":
        fake.models.remove("fake-7b")
    elif failure == "new_key":
        fake.api_key = "sk-rotated-key-1111111111"
    else:
        fake.stop()
    send(qtbot, window, "second")

    answer = last_answer(store, window)
    assert answer.status == "failed" and words in answer.error
    assert answer.content == partial  # what came is kept, and marked
    view = window.chat_view.message_views[answer.id]
    assert view.status_label.text() == "failed" and words in view.error_label.text()
    assert window.notice.isVisible() and words in window.notice.label.text()
    assert window.controller.can_send  # the conversation is usable
    first = store.messages(window.controller.conversation.id)[1]
    assert (first.content, first.status) == (ANSWER_TEXT, "done")
    if failure in ("cut", "error_chunk"):
        fake.mode = "ok"
        send(qtbot, window, "third")
        assert last_answer(store, window).content == ANSWER_TEXT


def test_a_model_gone_before_its_load_is_one_message(qtbot, make_window, fake, memory_keyring):
    window = make_window()
    window.open_model_picker()
    panel = window.picker.endpoint_panel
    add_endpoint(qtbot, panel, fake.base_url, KEY)
    panel.tree.setCurrentItem(model_item(panel, "fake-70b"))
    fake.models.remove("fake-70b")
    with qtbot.waitSignal(window.endpoint_client.sig_failed, timeout=10_000):
        window.picker.accept()
    assert "does not serve 'fake-70b'; it serves fake-7b" in window.notice.label.text()
    assert "No model in use" in window.model_status.label.text()
    assert not window.controller.can_send


def test_choosing_a_local_model_again_uses_the_worker(qtbot, make_window, fake,
                                                      memory_keyring):
    from engine.events import LoadRequest

    window = make_window()
    use_endpoint(qtbot, window, fake)
    with qtbot.waitSignal(window.worker.sig_loaded, timeout=10_000):
        window.load(LoadRequest())
    assert window.controller.worker is window.worker and window.endpoint_client.model is None
    panel = window.performance_panel  # the fake worker loads on the CPU: its charts are back
    assert panel.ttft_plot.isHidden() and not panel.rss_plot.isHidden()
    send(qtbot, window, "hi")
    assert len(fake.chat_requests) == 0


# ---------------------------------------------------------------- keys stay secret


def _bytes_of(*paths) -> bytes:
    return b"".join(p.read_bytes() for p in paths if p.exists())


def test_keys_never_reach_the_database_settings_or_log(qtbot, make_window, store, settings,
                                                       fake, memory_keyring, tmp_path):
    log_path = setup_logging(tmp_path)
    root = logging.getLogger()
    added = root.handlers[-2:]  # the console and the file handler setup_logging added
    try:
        window = make_window()
        use_endpoint(qtbot, window, fake)
        send(qtbot, window, "remember this")
        fake.api_key = "sk-rotated-key-1111111111"  # the server now refuses (and echoes) it
        send(qtbot, window, "and this")
        for handler in added:
            handler.flush()
        settings.q.sync()
        database = _bytes_of(store.path, store.path.with_name(store.path.name + "-wal"))
        assert b"remember this" in database  # the grep reads the real bytes
        assert b"asking the endpoint" in log_path.read_bytes()
        for name, data in (("database", database), ("settings", _bytes_of(tmp_path /
                           "settings.ini")), ("log", log_path.read_bytes())):
            assert KEY.encode() not in data, name
        assert memory_keyring.secrets[(SERVICE, fake.base_url)] == KEY
    finally:
        for handler in added:
            root.removeHandler(handler)
            handler.close()


def test_without_a_keyring_the_key_is_kept_for_the_session_only(qtbot, make_window, store,
                                                                settings, fake, no_keyring,
                                                                tmp_path):
    window = make_window()
    window.open_model_picker()
    panel = window.picker.endpoint_panel
    add_endpoint(qtbot, panel, fake.base_url, KEY)
    assert "No system keyring" in panel.status_label.text() and panel.status_label.isVisible()
    panel.tree.setCurrentItem(model_item(panel, "fake-7b"))
    with qtbot.waitSignal(window.endpoint_client.sig_loaded, timeout=10_000):
        window.picker.accept()
    assert "session only" in window.notice.label.text()
    send(qtbot, window, "hi")
    assert last_answer(store, window).content == ANSWER_TEXT  # the key was sent
    settings.q.sync()
    assert KEY.encode() not in _bytes_of(tmp_path / "settings.ini", store.path)
    assert EndpointKeys().get(fake.base_url) is None  # a new session has no key


def test_the_performance_panel_says_where_a_remote_model_runs(qtbot):
    from engine.events import Loaded, Stats

    panel = PerformancePanel()
    qtbot.addWidget(panel)
    panel.set_remote("gpu-box:8000")
    panel.add_stats(Stats(new_tokens=40, ttft_ms=180.0, decode_tokens_per_s=55.0))
    assert panel.latency_label.text() == ("55.0 tokens/s · first token 180 ms · 40 tokens · "
                                          "on gpu-box:8000")
    assert panel.ttft.last("ttft") == 180.0 and panel.vram_plot.isHidden()
    panel.set_loaded(Loaded("m", "qwen2", "cuda", "bf16", "bf16", 2048, 1, 1))
    assert not panel.vram_plot.isHidden() and panel.ttft_plot.isHidden()
