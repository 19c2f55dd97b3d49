"""A quantized KV cache on a real model (SmolLM2-135M-Instruct, 64-wide heads with outlier
channels in its keys), measured as `hearth eval --kv-dtype` reports it: perplexity and top-1
agreement with the model's own cache over the same windows, in one run, on text written after
the model was trained (tests/fixtures/heldout_2026.txt: the project's configuration guide as
of 2026-12-05, about 1,800 tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.serve.cli import main

TEXT = Path(__file__).resolve().parents[1] / "fixtures" / "heldout_2026.txt"
pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/engine/conftest.py


def eval_report(smollm2, kv: str, capsys) -> dict:
    assert main(["eval", "--model", str(smollm2), "--text", str(TEXT), "--quant", "fp32",
                 "--kv-dtype", kv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_int8_cache_keeps_the_fp32_caches_answers(smollm2, capsys):
    report = eval_report(smollm2, "int8", capsys)
    assert report["reference_kv_dtype"] == "fp32" and report["tokens"] > 1000
    assert report["top1_agreement"] >= 0.995, report
    assert report["perplexity_change"] <= 0.001, report

