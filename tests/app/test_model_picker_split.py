"""The model picker on several GPUs: the split the planner suggests when one card is too small
("needs 2 GPUs: tensor parallel 2, 17.5 GiB per GPU"), the GPUs row, the fit per GPU, and the
load request that carries tensor_parallel."""

from __future__ import annotations

import json

import pytest

from app.models.model_picker_dialog import ModelPickerDialog
from engine.formats.model_shape import ModelShape
from engine.plan.multi_gpu import recommend_split
from engine.platform.gpu import GpuInfo, GpuReport
from tests.app.test_model_picker import QWEN_7B, fits_column

GiB = 1 << 30
QWEN_14B = dict(QWEN_7B, hidden_size=5120, num_hidden_layers=48, num_attention_heads=40,
                num_key_value_heads=8, intermediate_size=13824)  # 29.5 GB of bf16 weights


def cards(n: int, gib: float = 24) -> GpuReport:
    size = int(gib * GiB)
    return GpuReport(tuple(GpuInfo(i, f"Fake {gib:g} GiB", f"GPU-{i}", size, size, 0, (8, 9),
                                   "560.35", True, True) for i in range(n)))


@pytest.fixture
def hub(tmp_path):
    """A Hugging Face cache with the config.json of a 7B and of a 14B model."""
    for name, config in (("Qwen2.5-7B-Instruct", QWEN_7B), ("Qwen2.5-14B-Instruct", QWEN_14B)):
        repo = tmp_path / "hub" / f"models--Qwen--{name}"
        snapshot = repo / "snapshots" / "abc123"
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(json.dumps(config))
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("abc123")
    return tmp_path / "hub"


def pick(qtbot, settings, hub, report, name: str) -> ModelPickerDialog:
    dialog = ModelPickerDialog(settings, report, hub=hub)
    qtbot.addWidget(dialog)
    item = next(dialog.model_list.item(i) for i in range(dialog.model_list.count())
                if name in dialog.model_list.item(i).text())
    dialog.model_list.setCurrentItem(item)
    dialog.fit_panel.context_spin.setValue(8192)
    return dialog


def gpus_row_shown(dialog) -> bool:
    return dialog.fit_panel.form.isRowVisible(dialog.fit_panel.gpus_spin)


def test_two_24_gib_cards_split_a_14b_model(qtbot, settings, hub):
    dialog = pick(qtbot, settings, hub, cards(2), "14B")
    fit = dialog.fit_panel
    split = recommend_split(ModelShape.from_config(QWEN_14B), 24 * GiB, 2, (8, 9), 8192)
    per_gpu = f"{split.plan.total_bytes_per_device / GiB:.1f} GiB per GPU"
    assert split.num_devices == 2 and 14 < split.plan.total_bytes_per_device / GiB < 24
    assert f"needs 2 GPUs: tensor parallel 2, {per_gpu}" in fit.split_label.text()
    assert "this machine has 2" in fit.split_label.text()
    assert gpus_row_shown(dialog) and fit.gpus_spin.value() == 2  # preselected: it runs here
    assert "2 GPUs in all" in fit.gpu_label.text()
    # the table is per GPU: 16-bit weights fit two cards; the engine cuts no 4-bit weights
    assert fits_column(dialog) == {"bf16": "yes", "fp16": "yes", "int8": "no", "nf4": "no",
                                   "awq": "no"}
    bf16 = fit.table_data.rows[0]
    assert 13 * GiB < bf16.weights_bytes < 15 * GiB  # half of 29.5 GB, plus the embedding
    assert "cuts 16-bit weights only" in fit.table_data.rows[2].reason
    assert fit.quant_combo.currentText() == "bf16" and fit.verdict_label.text().endswith("fits.")
    req = dialog.load_request()
    assert (req.tensor_parallel, req.quant, req.context) == (2, "bf16", 8192)
    req.validate()  # what the worker will accept


def test_one_card_too_small_says_how_many_are_needed(qtbot, settings, hub):
    dialog = pick(qtbot, settings, hub, cards(1), "14B")
    fit = dialog.fit_panel
    text = fit.split_label.text()
    assert "needs 2 GPUs: tensor parallel 2" in text and "this machine has 1" in text
    assert not gpus_row_shown(dialog) and fit.gpus_spin.value() == 1
    assert fit.table_data.recommended_quant == "nf4"  # one card: 4-bit weights
    assert fits_column(dialog)["bf16"] == "no"
    assert dialog.load_request().tensor_parallel == 1


def test_a_model_one_card_holds_is_not_split(qtbot, settings, hub):
    dialog = pick(qtbot, settings, hub, cards(2, 80), "7B")
    fit = dialog.fit_panel
    assert fit.split_label.text() == ""
    assert gpus_row_shown(dialog) and fit.gpus_spin.value() == 1
    one_card = fit.table_data.rows[0].weights_bytes
    assert dialog.load_request().tensor_parallel == 1
    fit.gpus_spin.setValue(2)  # asked for anyway: the fit per GPU, and the request carries it
    assert fit.table_data.rows[0].weights_bytes < 0.6 * one_card
    assert "Tensor parallel 2" in fit.recommendation_label.text()
    assert dialog.load_request().tensor_parallel == 2


def test_no_draft_beside_tensor_parallelism(qtbot, settings, hub):
    dialog = pick(qtbot, settings, hub, cards(2), "14B")
    fit = dialog.fit_panel
    fit.set_drafts([("small", "Qwen/small", ModelShape.from_config(QWEN_7B))])
    fit.speculation_combo.setCurrentIndex(2)
    assert "draft model stays off" in fit.recommendation_label.text()
    req = dialog.load_request()
    assert req.tensor_parallel == 2 and req.draft is None and req.num_speculative_tokens is None
    fit.gpus_spin.setValue(1)
    assert dialog.load_request().draft == "Qwen/small"


def test_last_load_keeps_tensor_parallel(settings):
    from engine.events import LoadRequest

    settings.set_last_load(LoadRequest(model="m", tensor_parallel=2))
    assert settings.last_load().tensor_parallel == 2
