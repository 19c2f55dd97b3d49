"""Import GGUF in the picker: the real `hearth import` child refusing a crafted bad file with its
one sentence, a cancel that kills the child and leaves nothing, and a finished import (a fake
import command) listed and selected; and the starter model preferred over the demo model."""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer

from app import __main__ as app_main
from app.get_model.gguf_import_job import GGUFImportJob
from app.models.model_catalog import imported_entries
from app.models.model_picker_dialog import ENTRY_ROLE, ModelPickerDialog
from app.paths import DEMO_MODEL_DIR
from engine.files.model_home import STARTER_NAME, default_model, models_dir, starter_dir

FAKE_IMPORT = Path(__file__).resolve().parent / "fake_import.py"
FAKE_COMMAND = (sys.executable, str(FAKE_IMPORT))


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def picker(qtbot, settings, command=None) -> ModelPickerDialog:
    dialog = ModelPickerDialog(settings, gguf_import=GGUFImportJob(command))
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog


def listed(dialog) -> list[tuple[str, str]]:
    entries = (dialog.model_list.item(i).data(ENTRY_ROLE) for i in range(dialog.model_list.count()))
    return [(e.label, e.source) for e in entries]


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("header, sentence", [
    (struct.pack("<IQQ", 3, 0, 0), "holds no tensors"),
    (struct.pack("<IQQ", 3, 10**9, 2), "more than the file can hold"),
])
def test_a_bad_gguf_fails_with_the_child_s_one_sentence(qtbot, settings, home, tmp_path, header,
                                                         sentence):
    bad = tmp_path / "bad.Q4_K_M.gguf"
    bad.write_bytes(b"GGUF" + header + b"\0" * 4072)
    dialog = picker(qtbot, settings)  # the real `python -m engine.cli.cli import` child
    panel = dialog.gguf_import_panel
    with qtbot.waitSignal(dialog.gguf_import.sig_failed, timeout=30_000) as failed:
        panel.import_file(bad)
        assert panel.cancel_button.isVisible() and not panel.import_file_button.isEnabled()
    [error] = failed.args
    assert sentence in error and "\n" not in error and "Traceback" not in error
    assert error.startswith(str(bad))  # the child's sentence, without its "hearth: " prefix
    assert panel.status_label.text() == f"Import failed: {error}"
    assert panel.import_file_button.isEnabled() and not panel.cancel_button.isVisible()
    assert not dialog.gguf_import.is_busy
    assert [s for _, s in listed(dialog)] == ["demo"]
    assert not models_dir().exists() or not any(models_dir().iterdir())


def test_cancel_kills_the_import_and_nothing_is_listed(qtbot, settings, home, tmp_path,
                                                       monkeypatch):
    monkeypatch.setenv("HEARTH_FAKE_IMPORT", "hang")
    gguf = tmp_path / "Llama-3.2-1B.Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF" + bytes(996))
    dialog = picker(qtbot, settings, FAKE_COMMAND)
    job, panel = dialog.gguf_import, dialog.gguf_import_panel
    ticks = []
    timer = QTimer(dialog)
    timer.timeout.connect(lambda: ticks.append(1))
    timer.start(20)
    panel.import_file(gguf)
    qtbot.waitUntil(lambda: job.progress is not None and job.progress.done == 3, timeout=10_000)
    assert "dequantizing" in panel.status_label.text() and panel.progress_bar.value() == 3
    assert ticks, "the window stopped while the import ran"
    pid = job.pid
    work = models_dir() / ".Llama-3.2-1B.importing-fake"
    assert is_alive(pid) and (work / "config.json").is_file()  # the child is mid-write

    with qtbot.waitSignal(job.sig_cancelled, timeout=5_000):
        panel.cancel_button.click()
    assert not is_alive(pid) and not job.is_busy
    assert not work.exists() and not any(models_dir().iterdir())  # nothing half-written kept
    assert imported_entries() == [] and [s for _, s in listed(dialog)] == ["demo"]
    assert "cancelled" in panel.status_label.text()
    assert panel.import_file_button.isEnabled() and not panel.cancel_button.isVisible()


def test_a_finished_import_is_listed_and_selected(qtbot, settings, home):
    gguf = home / ".lmstudio/models/HuggingFaceTB/SmolLM2-GGUF/Tiny-Chat.Q4_1.gguf"
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF" + bytes(2_000_000 - 4))
    dialog = picker(qtbot, settings, FAKE_COMMAND)
    panel = dialog.gguf_import_panel
    assert panel.sources_table.item(0, 0).text().endswith("Tiny-Chat.Q4_1.gguf")
    with qtbot.waitSignal(dialog.gguf_import.sig_imported, timeout=10_000) as imported:
        panel.sources_table.cellWidget(0, 3).click()  # the row's own Import button
        assert not panel.sources_table.cellWidget(0, 3).isEnabled()  # one import at a time
    [result] = imported.args
    assert result.folder == (models_dir() / "Tiny-Chat").resolve()
    entry = dialog.selected_entry()
    assert (entry.label, entry.source) == ("Tiny-Chat", "imported")
    assert entry.folder.resolve() == result.folder
    assert dialog.load_request().model == str(entry.folder)
    assert dialog.load_button.isEnabled()  # the fit panel read the new folder
    note = panel.status_label.text()
    assert "now 16-bit (8.0 MB, about 4.0x the GGUF's 2.0 MB on disk)" in note
    assert "NF4" in note and "AWQ" in note and "offered when you load it" in note
    assert panel.sources_table.cellWidget(0, 3).isEnabled()


def test_an_import_finished_with_the_picker_closed_is_announced(qtbot, make_window, tmp_path):
    window = make_window()
    window.gguf_import.command = FAKE_COMMAND
    gguf = tmp_path / "Qwen-Tiny.Q8_0.gguf"
    gguf.write_bytes(b"GGUF" + bytes(96))
    with qtbot.waitSignal(window.gguf_import.sig_imported, timeout=10_000):
        window.gguf_import.start(gguf)
    assert "Qwen-Tiny is imported" in window.notice.text
    window.open_model_picker()
    assert ("Qwen-Tiny", "imported") in listed(window.picker)


def test_the_starter_model_is_preferred_over_the_demo_model(qtbot, settings, home):
    assert default_model() is None  # no starter: the bundled demo model (LoadRequest None)
    assert app_main.load_request(app_main.parse_args([])).model is None
    dialog = picker(qtbot, settings)
    assert dialog.selected_entry().source == "demo"

    starter_dir().mkdir(parents=True)
    for name in ("config.json", "generation_config.json"):
        shutil.copy(DEMO_MODEL_DIR / name, starter_dir() / name)
    assert app_main.load_request(app_main.parse_args([])).model == str(starter_dir())
    assert app_main.load_request(app_main.parse_args(["--model", "x/y"])).model == "x/y"
    dialog = picker(qtbot, settings)
    assert (dialog.selected_entry().label, dialog.selected_entry().source) == (
        STARTER_NAME, "imported")
    assert dialog.load_request().model == str(starter_dir())
    assert ("Demo model (bundled)", "demo") in listed(dialog)  # still there, as the fallback


def test_a_card_found_later_still_chooses_over_the_starter(qtbot, settings, home, tmp_path):
    from tests.app.test_model_picker import QWEN_7B, card

    snapshot = tmp_path / "hub/models--Qwen--Qwen2.5-7B-Instruct/snapshots/a09a3545"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(QWEN_7B))
    starter_dir().mkdir(parents=True)
    shutil.copy(DEMO_MODEL_DIR / "config.json", starter_dir() / "config.json")
    dialog = ModelPickerDialog(settings, hub=tmp_path / "hub")  # no card known yet
    qtbot.addWidget(dialog)
    assert dialog.selected_entry().label == STARTER_NAME
    dialog.set_gpu_report(card(80))  # a first run: the largest model this card runs
    assert dialog.selected_entry().label == "Qwen/Qwen2.5-7B-Instruct"
