"""The model picker: models from the Hub cache and added folders, and fit / no fit per format
for a faked card, from the planner."""

from __future__ import annotations

import json

import pytest

from app.models import fit_check
from app.models.fit_panel import SpeculationChoice
from app.models.model_catalog import all_entries, hub_entries
from app.models.model_picker_dialog import ModelPickerDialog
from app.paths import DEMO_DRAFT_DIR
from engine.events import GenerateRequest, LoadRequest
from engine.platform.gpu import GpuInfo, GpuReport

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
    t = dialog.fit_panel.fit_table
    return {t.item(r, 0).text(): t.item(r, 4).text() for r in range(t.rowCount())}


def test_hub_cache_models_are_listed(hub):
    [entry] = hub_entries(hub)
    assert entry.load_name == "Qwen/Qwen2.5-7B-Instruct" and entry.source == "hub"
    assert entry.folder.name == "a09a3545"


def test_an_8_gib_card_fits_4_bit_but_not_bf16(qtbot, settings, hub):
    dialog = pick(qtbot, settings, hub, card(8))
    fit = dialog.fit_panel
    fit.context_spin.setValue(8192)
    assert "qwen2" in fit.summary_label.text() and "32,768" in fit.summary_label.text()
    assert "Fake 8 GiB" in dialog.fit_panel.gpu_label.text()
    assert fits_column(dialog) == {"bf16": "no", "fp16": "no", "int8": "no", "nf4": "yes",
                                   "awq": "yes"}
    bf16 = dialog.fit_panel.table_data.rows[0]
    assert bf16.weights_bytes > 14 * GiB and bf16.total_bytes > bf16.weights_bytes + bf16.kv_bytes
    assert float(fit.fit_table.item(0, 1).text()) == pytest.approx(bf16.weights_bytes / GiB,
                                                                   abs=0.01)
    assert dialog.fit_panel.table_data.recommended_quant == "nf4"
    assert dialog.fit_panel.quant_combo.currentText() == "nf4"  # the recommendation is preselected
    assert dialog.fit_panel.verdict_label.text().endswith(": fits.")
    dialog.fit_panel.fit_table.cellClicked.emit(0, 0)  # choosing bf16 says it will not fit, and why
    assert dialog.fit_panel.quant_combo.currentText() == "bf16"
    verdict = dialog.fit_panel.verdict_label.text()
    assert verdict.startswith("bf16 needs ") and "this card has 8.0 GiB free" in verdict
    assert verdict.endswith("does not fit.")
    assert dialog.load_request() == LoadRequest(model="Qwen/Qwen2.5-7B-Instruct", quant="bf16",
                                                kv_dtype="auto", context=8192)
    dialog.fit_panel.reproducible_check.setChecked(True)  # the mode, asked for at load
    assert dialog.load_request().reproducible is True
    assert "17-24x" in dialog.fit_panel.reproducible_check.toolTip()  # its cost, said first


def test_a_big_card_fits_bf16(qtbot, settings, hub):
    dialog = pick(qtbot, settings, hub, card(80))
    assert fits_column(dialog)["bf16"] == "yes"
    assert dialog.fit_panel.quant_combo.currentText() == "bf16"


def test_without_a_gpu_the_table_fits_the_computers_memory(qtbot, settings, hub, monkeypatch):
    monkeypatch.setattr(fit_check, "available_ram_bytes", lambda: 8 * GiB)
    dialog = pick(qtbot, settings, hub, GpuReport((), "no NVIDIA driver is installed; CPU mode"))
    fits = fits_column(dialog)
    assert (fits["bf16"], fits["nf4"]) == ("no", "yes")  # 15 GiB of weights, then 5 GiB
    assert "8.0 GiB of memory free" in dialog.fit_panel.gpu_label.text()
    table = dialog.fit_panel.fit_table
    bf16 = next(r for r in range(table.rowCount()) if table.item(r, 0).text() == "bf16")
    reason = table.item(bf16, 4).toolTip()
    assert "on the CPU, this computer has 8.0 GiB of memory free" in reason
    dialog.set_gpu_report(card(8))  # the report arrives after the dialog opened
    assert fits_column(dialog)["nf4"] == "yes"
    assert "this card has 8.0 GiB free" in table.item(bf16, 4).toolTip()


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
    assert "has no config.json" in dialog.fit_panel.summary_label.text()
    assert dialog.fit_panel.fit_table.rowCount() == 0
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


def test_speculative_decoding_with_the_bundled_draft(qtbot, settings, hub):
    dialog = ModelPickerDialog(settings, card(8), hub=hub)
    qtbot.addWidget(dialog)
    assert "Qwen2.5-7B" in dialog.selected_entry().label  # a first run: the model the card runs
    dialog.model_list.setCurrentRow(0)
    assert dialog.selected_entry().source == "demo"
    fit = dialog.fit_panel
    offered = [fit.speculation_combo.itemText(i) for i in range(fit.speculation_combo.count())]
    assert offered == ["Off", "Prompt lookup (no extra model)", "Draft: demo_draft (bundled)"]
    plain_total = fit.table_data.rows[0].total_bytes
    assert not fit.speculative_spin.isEnabled()
    fit.speculation_combo.setCurrentIndex(2)
    fit.speculative_spin.setValue(4)
    assert fit.table_data.rows[0].total_bytes > plain_total  # the draft's weights and cache
    assert "the draft model's" in fit.verdict_label.text()
    request = dialog.load_request()
    assert (request.model, request.draft, request.num_speculative_tokens) == (
        None, str(DEMO_DRAFT_DIR), 4)
    dialog.model_list.setCurrentRow(1)  # a 7B Qwen: another vocabulary, no draft offered
    assert "Qwen2.5-7B" in dialog.selected_entry().label
    assert fit.speculation_combo.count() == 2 and fit.speculation() == SpeculationChoice()


def test_prompt_lookup_goes_with_each_answer(qtbot, make_window, fake_log):
    window = make_window()
    window.open_model_picker()
    fit = window.picker.fit_panel
    fit.speculation_combo.setCurrentIndex(1)
    fit.speculative_spin.setValue(3)
    with qtbot.waitSignal(window.worker.sig_loaded, timeout=10_000):
        window.picker.accept()
    assert [r for r in fake_log() if isinstance(r, LoadRequest)][-1].draft is None
    window.chat_view.input.setPlainText("hi")
    with qtbot.waitSignal(window.worker.sig_finished, timeout=10_000):
        window.chat_view.send_button.click()
    [generate] = [r for r in fake_log() if isinstance(r, GenerateRequest)]
    assert (generate.prompt_lookup, generate.num_speculative_tokens) == (True, 3)
    window.open_model_picker()  # it shows the choice in force
    assert window.picker.fit_panel.speculation() == SpeculationChoice(prompt_lookup=True,
                                                                num_speculative_tokens=3)


QWEN_05B = dict(QWEN_7B, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                tie_word_embeddings=True)
QWEN_72B = dict(QWEN_7B, hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, intermediate_size=29568)


@pytest.fixture
def hub3(tmp_path):
    """A cache with the 0.5B, 7B and 72B shapes: the picker must weigh them against the card."""
    for name, config in (("0.5B", QWEN_05B), ("7B", QWEN_7B), ("72B", QWEN_72B)):
        snapshot = tmp_path / "hub" / f"models--Qwen--Qwen2.5-{name}-Instruct" / "snapshots" / "r"
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(json.dumps(config))
    return tmp_path / "hub"


@pytest.mark.parametrize(("gib", "quant"), [(24, "bf16"), (8, "nf4")])
def test_first_run_with_a_gpu_preselects_the_largest_model_that_fits(qtbot, settings, hub3, gib,
                                                                      quant):
    dialog = ModelPickerDialog(settings, card(gib), hub=hub3)
    qtbot.addWidget(dialog)
    assert dialog.selected_entry().load_name == "Qwen/Qwen2.5-7B-Instruct"  # 72B fits neither
    assert dialog.fit_panel.quant_combo.currentText() == quant


def test_first_run_without_a_gpu_stays_on_the_demo_model(qtbot, settings, hub3):
    dialog = ModelPickerDialog(settings, GpuReport((), "no NVIDIA driver; CPU mode"), hub=hub3)
    qtbot.addWidget(dialog)
    assert dialog.selected_entry().source == "demo"
    dialog.set_gpu_report(card(80))  # the card is detected after the dialog opened
    assert dialog.selected_entry().load_name == "Qwen/Qwen2.5-72B-Instruct"  # 80 GiB: 72B NF4
    assert dialog.fit_panel.quant_combo.currentText() == "nf4"


def test_a_remembered_model_wins_over_the_recommendation(qtbot, settings, hub3):
    settings.set_last_load(LoadRequest(model="Qwen/Qwen2.5-0.5B-Instruct"))
    dialog = ModelPickerDialog(settings, card(24), hub=hub3)
    qtbot.addWidget(dialog)
    assert dialog.selected_entry().load_name == "Qwen/Qwen2.5-0.5B-Instruct"
