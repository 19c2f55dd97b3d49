"""The model picker: models from the Hub cache and added folders, and fit / no fit per format
for a faked card, from the planner."""

from __future__ import annotations

import json

import pytest

from app.model_catalog import all_entries, hub_entries
from app.model_picker_dialog import ModelPickerDialog
from engine.events import LoadRequest
from engine.gpu import GpuInfo, GpuReport

GiB = 1 << 30
QWEN_7B = {  # Qwen2.5-7B-Instruct's config.json, the fields the planner reads
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "intermediate_size": 18944, "vocab_size": 152064, "max_position_embeddings": 32768,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False,
    "sliding_window": 131072,
}


def card(gib: float) -> GpuReport:
    size = int(gib * GiB)
    return GpuReport((GpuInfo(0, f"Fake {gib:g} GiB", "GPU-fake", size, size, 0, (8, 9),
                              "560.35", True, True),))


@pytest.fixture
def hub(tmp_path):
    """A Hugging Face cache holding Qwen2.5-7B-Instruct's config.json only."""
    repo = tmp_path / "hub" / "models--Qwen--Qwen2.5-7B-Instruct"
    snapshot = repo / "snapshots" / "a09a3545"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(QWEN_7B))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a09a3545")
    return tmp_path / "hub"


def pick(qtbot, settings, hub, report) -> ModelPickerDialog:
    dialog = ModelPickerDialog(settings, report, hub=hub)
    qtbot.addWidget(dialog)
    item = next(dialog.model_list.item(i) for i in range(dialog.model_list.count())
                if "Qwen2.5-7B" in dialog.model_list.item(i).text())
    dialog.model_list.setCurrentItem(item)
    return dialog


def fits_column(dialog) -> dict[str, str]:
    t = dialog.fit_table
    return {t.item(r, 0).text(): t.item(r, 4).text() for r in range(t.rowCount())}


def test_hub_cache_models_are_listed(hub):
    [entry] = hub_entries(hub)
    assert entry.load_name == "Qwen/Qwen2.5-7B-Instruct" and entry.source == "hub"
    assert entry.folder.name == "a09a3545"


def test_an_8_gib_card_fits_4_bit_but_not_bf16(qtbot, settings, hub):
    dialog = pick(qtbot, settings, hub, card(8))
    dialog.context_spin.setValue(8192)
    assert "qwen2" in dialog.summary_label.text() and "32,768" in dialog.summary_label.text()
    assert "Fake 8 GiB" in dialog.gpu_label.text()
    assert fits_column(dialog) == {"bf16": "no", "int8": "no", "nf4": "yes", "awq": "yes"}
    bf16 = dialog.table_data.rows[0]
    assert bf16.weights_bytes > 14 * GiB and bf16.total_bytes > bf16.weights_bytes + bf16.kv_bytes
    assert float(dialog.fit_table.item(0, 1).text()) == pytest.approx(bf16.weights_bytes / GiB,
                                                                      abs=0.01)
    assert dialog.table_data.recommended_quant == "nf4"
    assert dialog.quant_combo.currentText() == "nf4"  # the recommendation is preselected
    assert dialog.verdict_label.text().endswith(": fits.")
    dialog.fit_table.cellClicked.emit(0, 0)  # choosing bf16 says it will not fit, and why
    assert dialog.quant_combo.currentText() == "bf16"
    verdict = dialog.verdict_label.text()
    assert verdict.startswith("bf16 needs ") and "this card has 8.0 GiB free" in verdict
    assert verdict.endswith("does not fit.")
    assert dialog.load_request() == LoadRequest(model="Qwen/Qwen2.5-7B-Instruct", quant="bf16",
                                                kv_dtype="auto", context=8192)


def test_a_big_card_fits_bf16(qtbot, settings, hub):
    dialog = pick(qtbot, settings, hub, card(80))
    assert fits_column(dialog)["bf16"] == "yes"
    assert dialog.quant_combo.currentText() == "bf16"


def test_without_a_gpu_the_table_says_so(qtbot, settings, hub):
    dialog = pick(qtbot, settings, hub, GpuReport((), "no NVIDIA driver is installed; CPU mode"))
    assert set(fits_column(dialog).values()) == {"no GPU"}
    assert "No GPU: no NVIDIA driver" in dialog.gpu_label.text()
    dialog.set_gpu_report(card(8))  # the report arrives after the dialog opened
    assert fits_column(dialog)["nf4"] == "yes"


def test_an_added_folder_is_remembered(qtbot, settings, hub, tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**QWEN_7B, "num_hidden_layers": 2}))
    dialog = ModelPickerDialog(settings, card(8), hub=hub)
    qtbot.addWidget(dialog)
    dialog.add_folder(folder)
    assert settings.model_folders() == [folder]
    assert dialog.selected_entry().folder == folder
    assert dialog.load_request().model == str(folder)
    assert [e.source for e in all_entries(settings.model_folders(), hub)][-2:] == ["hub", "folder"]


def test_a_folder_the_planner_cannot_read_is_explained(qtbot, settings, hub, tmp_path):
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    dialog = ModelPickerDialog(settings, card(8), hub=hub)
    qtbot.addWidget(dialog)
    dialog.add_folder(folder)
    assert "has no config.json" in dialog.summary_label.text()
    assert dialog.fit_table.rowCount() == 0
    assert not dialog.load_button.isEnabled()


def test_the_window_loads_what_the_picker_chose(qtbot, make_window, hub, fake_log):
    window = make_window()
    qtbot.waitUntil(lambda: window.gpu_probe.report is not None)  # this machine's, then a fake
    window.open_model_picker()
    window.picker.set_gpu_report(card(8))
    item = next(window.picker.model_list.item(i) for i in range(window.picker.model_list.count())
                if "Qwen2.5-7B" in window.picker.model_list.item(i).text())
    window.picker.model_list.setCurrentItem(item)
    with qtbot.waitSignal(window.worker.sig_loaded, timeout=10_000):
        window.picker.accept()
    request = [r for r in fake_log() if isinstance(r, LoadRequest)][-1]
    assert (request.model, request.quant) == ("Qwen/Qwen2.5-7B-Instruct", "nf4")
    assert window.settings.last_load() == request
