"""Truthful, calm chrome: the demo-model banner goes when another model loads, the status bar is
one short line cut only between whole parts (details in its tooltip), the crash banner names
the engine's real error rather than its last warning, and banners sit above the content (never
over the sidebar's controls), wrapped, with `code` shown as code."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import QPoint, QRect, QSize
from PySide6.QtGui import QTextDocument

from app.crash_report import engine_error
from app.main_window import DEMO_NOTICE
from app.paths import DEMO_MODEL_DIR
from app.server.server_panel import NEEDS_MODEL, READY
from app.widgets.fitted_label import FittedLabel
from engine.events import Loaded, LoadRequest

RECORDINGS = Path(__file__).parent / "recordings"


def demo_load_recording(tmp_path: Path) -> Path:
    """load.jsonl with the bundled demo model's folder as what was loaded."""
    lines = (RECORDINGS / "load.jsonl").read_text().splitlines()
    loaded = json.loads(lines[-1])
    loaded["model"] = str(DEMO_MODEL_DIR)
    path = tmp_path / "load_demo.jsonl"
    path.write_text("\n".join([*lines[:-1], json.dumps(loaded)]) + "\n")
    return path


def test_the_demo_banner_goes_when_another_model_is_loaded(qtbot, make_window, tmp_path,
                                                           monkeypatch):
    demo = demo_load_recording(tmp_path)
    window = make_window(HEARTH_FAKE_LOAD=str(demo))
    assert window.notice.isVisible() and "demo model on the CPU" in window.notice.text
    # the same worker loads the user's own model (load.jsonl) next
    window.worker.extra_env["HEARTH_FAKE_LOAD"] = "load.jsonl"
    window.worker.kill()
    with qtbot.waitSignal(window.worker.sig_loaded, timeout=10_000):
        window.load(LoadRequest(model="/models/mine"))
    assert not window.notice.isVisible()
    assert window.chat_view.welcome.get_model_button.isHidden()


def test_another_notice_is_not_hidden_by_a_model_switch(qtbot, make_window):
    window = make_window()
    window.notice.show_message("a download finished", is_error=False)
    with qtbot.waitSignal(window.worker.sig_loaded, timeout=10_000):
        window.load(LoadRequest(model="/models/mine"))
    assert window.notice.isVisible() and window.notice.text == "a download finished"


def test_the_status_bar_is_one_short_line_with_the_details_in_its_tooltip(qtbot, make_window):
    window = make_window()
    label = window.model_status.label
    assert label.text() == "demo-qwen2-tiny · bf16 · KV bf16 · 2,048 tokens · CPU"
    tip = label.toolTip()
    assert tip.startswith(label.text() + "\n")
    assert "Qwen2ForCausalLM" in tip and "weights 0.01 GiB in bf16" in tip
    assert "KV cache 0.01 GiB in bf16" in tip


def test_a_narrow_status_line_drops_whole_parts_never_a_word(qtbot):
    label = FittedLabel()
    qtbot.addWidget(label)
    parts = ["Qwen2.5-7B-Instruct", "nf4", "KV fp8", "32,768 tokens", "GPU 0"]
    label.set_parts(parts, "details")
    label.show()
    full = label.fontMetrics().horizontalAdvance(" · ".join(parts))
    seen = set()
    for width in range(label.minimumWidth(), full + 40, 7):
        label.resize(width, 20)
        text = label.text()
        seen.add(text)
        shown = text.removesuffix(" …").split(" · ")
        assert shown == parts[:len(shown)]  # whole parts, from the start
        assert text.endswith(" …") == (len(shown) < len(parts))
        assert label.fontMetrics().horizontalAdvance(text) <= max(width, label.minimumWidth())
    assert " · ".join(parts) in seen and "Qwen2.5-7B-Instruct …" in seen
    assert label.toolTip() == " · ".join(parts) + "\ndetails"


TRACEBACK_THEN_WARNINGS = """\
Traceback (most recent call last):
  File "/x/engine/cli/worker.py", line 88, in main
    session.load(request)
  File "/x/engine/load/loader.py", line 12, in load
    raise RuntimeError("CUDA error: an illegal memory access was encountered")
RuntimeError: CUDA error: an illegal memory access was encountered
/x/site-packages/torch/cuda/__init__.py:7: UserWarning: CUDA initialization: unknown error
  warnings.warn(
[W1201 12:00:00.000 ProcessGroupNCCL.cpp:1] Warning: destroy_process_group() was not called
"""


def test_the_crash_report_is_the_real_error_not_the_last_warning():
    assert engine_error(TRACEBACK_THEN_WARNINGS) == (
        "RuntimeError: CUDA error: an illegal memory access was encountered")
    assert engine_error("torch.OutOfMemoryError: CUDA out of memory. Tried 2 GiB\n"
                        "FutureWarning: something\n") == (
        "torch.OutOfMemoryError: CUDA out of memory. Tried 2 GiB")
    assert engine_error("UserWarning: x\nSegmentation fault (core dumped)\n") == (
        "Segmentation fault (core dumped)")
    assert engine_error("DeprecationWarning: old\n  warnings.warn(\n") == ""
    assert engine_error("") == ""


def test_the_crash_banner_shows_the_engines_real_error(qtbot, make_window, store):
    window = make_window(HEARTH_FAKE_CRASH_AFTER="2",
                         HEARTH_FAKE_CRASH_STDERR=TRACEBACK_THEN_WARNINGS)
    with qtbot.waitSignal(window.worker.sig_worker_died, timeout=10_000):
        window.chat_view.input.setPlainText("hi")
        window.chat_view.send_button.click()
    text = window.notice.text
    assert "exited with code 3" in text
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in text
    assert "destroy_process_group" not in text and "UserWarning" not in text


def rect_in(window, widget) -> QRect:
    return QRect(widget.mapTo(window, QPoint(0, 0)), widget.size())


def test_the_first_start_banner_is_wrapped_rich_text_beside_the_sidebar(qtbot, make_window,
                                                                     tmp_path):
    window = make_window(HEARTH_FAKE_LOAD=str(demo_load_recording(tmp_path)))
    notice, label = window.notice, window.notice.label
    sidebar = window.conversation_list
    controls = (sidebar.new_button, sidebar.import_button, sidebar.search_edit)
    assert window.size() == QSize(1280, 800)  # the default window, never resized
    qtbot.waitUntil(lambda: notice.isVisible() and label.height() >= label.heightForWidth(
        label.width()))
    # the whole text on wrapped lines, nothing elided
    assert notice.text.startswith(DEMO_NOTICE) and notice.text.endswith("runs on the CPU.")
    assert label.wordWrap() and label.heightForWidth(label.width()) > 1.5 * (
        label.fontMetrics().lineSpacing())
    assert rect_in(window, label).right() <= rect_in(window, notice).right()
    # rich text: `hearth import --starter` is code, and no backtick is printed
    assert "<code>hearth import --starter</code>" in label.text()
    document = QTextDocument()
    document.setHtml(label.text())
    assert document.toPlainText() == notice.text.replace("`", "")
    # in the flow: the banner covers none of the sidebar's controls, and they stay visible
    for control in controls:
        assert control.isVisible()
        assert not rect_in(window, notice).intersects(rect_in(window, control))

    window.storage_notice.show_message("Conversations are kept in memory only")
    qtbot.waitUntil(lambda: window.storage_notice.isVisible())
    banners = [rect_in(window, b) for b in (window.storage_notice, notice)]
    assert not banners[0].intersects(banners[1])
    for control in controls:
        assert not any(b.intersects(rect_in(window, control)) for b in banners)
    notice.close_button.click()
    window.storage_notice.close_button.click()
    assert not notice.isVisible() and not window.storage_notice.isVisible()


def test_a_notice_shows_markup_from_the_engine_as_text(qtbot, make_window):
    window = make_window()
    window.notice.show_message("Could not load <b>model</b> & its `config.json`")
    document = QTextDocument()
    document.setHtml(window.notice.label.text())
    assert document.toPlainText() == "Could not load <b>model</b> & its config.json"


def test_during_the_first_load_the_welcome_page_says_loading_as_the_status_bar_does(
        qtbot, make_window):
    window = make_window(load=False)
    welcome = window.chat_view.welcome
    with qtbot.waitSignal(window.worker.sig_loaded, timeout=10_000):
        window.start(LoadRequest())
        assert window.model_status.label.text().startswith("Loading")
        assert welcome.model_label.text().startswith("Loading")
        assert "No model is loaded" not in welcome.model_label.text()
    assert "tokens of context" in welcome.model_label.text()


def test_a_failed_load_ends_the_welcome_pages_loading(qtbot, make_window):
    window = make_window(load=False, HEARTH_FAKE_LOAD="load_failed.jsonl")
    with qtbot.waitSignal(window.worker.sig_failed, timeout=10_000):
        window.start(LoadRequest())
    assert window.chat_view.welcome.model_label.text().startswith("No model is loaded")


def test_the_server_tab_does_not_ask_for_a_model_once_one_is_loaded(qtbot, make_window):
    window = make_window(load=False)
    panel = window.server_panel
    with qtbot.waitSignal(window.worker.sig_loaded, timeout=10_000):
        window.start(LoadRequest())
        assert panel.status_label.text() == NEEDS_MODEL  # none yet: true while it loads
    assert panel.start_button.isEnabled()
    assert "Load a model first" not in panel.status_label.text()
    assert panel.status_label.text() == READY


def test_an_endpoint_shows_where_it_runs_in_the_status_line(qtbot, make_window):
    window = make_window()
    window.model_status.show_remote("fake-7b", "127.0.0.1:8000", 0)
    assert window.model_status.label.text() == "fake-7b · on the endpoint at 127.0.0.1:8000"
    window.model_status.show_loaded(Loaded("/m/x", "LlamaForCausalLM", "cuda:0", "nf4", "fp8",
                                           8192, 1 << 30, 1 << 28, ("sliding window off",)))
    assert window.model_status.label.text() == "x · nf4 · KV fp8 · 8,192 tokens · GPU 0"
