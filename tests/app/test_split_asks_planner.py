"""The picker's advice for several GPUs follows the planner's rules rather than a copy of them:
change what engine.plan says (the 16-bit dtype, what tensor parallelism cuts) and the app's
answer changes with it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.models import split_check
from engine.formats.model_shape import ModelShape
from engine.plan import choices, multi_gpu
from tests.app.test_model_picker_split import QWEN_14B, cards

SHAPE = ModelShape.from_config(QWEN_14B)


def rows(n: int = 2, kv: str = "auto", report=None) -> dict:
    table = split_check.fit_table(SHAPE, report or cards(n), n, kv, 8192)
    return {r.quant: r for r in table.rows}


@pytest.mark.parametrize("cc", [(7, 5), (8, 0), (9, 0)])
def test_the_recommended_16_bit_dtype_is_the_planners(cc):
    report = cards(2)
    report = replace(report, gpus=tuple(replace(g, compute_capability=cc) for g in report.gpus))
    table = split_check.fit_table(SHAPE, report, 2, "auto", 8192)
    assert table.recommended_quant == choices.sixteen_bit(cc)
    assert table.recommended_quant == ("fp16" if cc < (8, 0) else "bf16")


def test_a_changed_16_bit_rule_changes_the_apps_recommendation(monkeypatch):
    assert split_check.fit_table(SHAPE, cards(2), 2, "auto", 8192).recommended_quant == "bf16"
    monkeypatch.setattr(choices, "sixteen_bit", lambda cc=None: "fp16")
    table = split_check.fit_table(SHAPE, cards(2), 2, "auto", 8192)  # Ada cards: bf16 natively
    assert table.recommended_quant == "fp16"


def test_the_formats_a_split_cuts_are_the_planners(monkeypatch):
    before = rows()
    assert before["int8"].fits is False
    assert before["int8"].reason.endswith("tensor parallelism cuts 16-bit weights only so far")
    assert before["bf16"].fits is True
    # the day the engine cuts INT8 shards: the planner's list grows and the app's row follows
    monkeypatch.setattr(multi_gpu, "ENGINE_TP_FORMATS", (*multi_gpu.ENGINE_TP_FORMATS, "int8"))
    after = rows(kv="bf16")
    assert after["int8"].fits is True and "cuts 16-bit" not in after["int8"].reason
    assert after["int8"].total_bytes < before["bf16"].total_bytes
    assert after["nf4"].fits is False  # still not cut


def test_a_quantized_cache_is_refused_by_the_planners_rule(monkeypatch):
    assert rows(kv="fp8")["bf16"].reason.endswith("keeps a 16-bit KV cache so far")
    monkeypatch.setattr(multi_gpu, "tp_refusal", lambda quant, kv: None)
    row = rows(kv="fp8")["bf16"]
    assert row.fits is True and row.kv_dtype == "fp8"
    assert "16-bit KV cache" not in row.reason


def test_the_kv_cache_of_a_split_follows_the_weights():
    assert multi_gpu.tp_kv_dtype("fp16") == "fp16" and multi_gpu.tp_kv_dtype("bf16") == "bf16"
    assert multi_gpu.tp_kv_dtype("bf16", "fp16") == "fp16"  # asked for: as asked
    assert multi_gpu.tp_refusal("bf16", "bf16") is None
    assert multi_gpu.tp_refusal("nf4", "bf16").endswith("cuts 16-bit weights only so far")
    assert multi_gpu.tp_refusal("bf16", "int8").endswith("keeps a 16-bit KV cache so far")
