"""A quantized KV cache on a real model (SmolLM2-135M-Instruct, 64-wide heads with outlier
channels in its keys), measured as `hearth eval --kv-dtype` reports it: perplexity and top-1
agreement with the model's own cache over the same windows, in one run, on text written after
the model was trained (tests/fixtures/heldout_2026.txt: the project's configuration guide as
of 2026-12-05)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.events import LoadRequest
from engine.generate.session import Session
from engine.serve.cli import main
from engine.tools.eval import perplexity

TEXT = Path(__file__).resolve().parents[1] / "fixtures" / "heldout_2026.txt"
pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/engine/conftest.py


@pytest.fixture(scope="module")
def int8_report(smollm2) -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["eval", "--model", str(smollm2), "--text", str(TEXT), "--quant", "fp32",
                     "--kv-dtype", "int8", "--json"]) == 0
    return json.loads(out.getvalue())


def test_rotated_int8_keys_cost_less_than_per_token_scales(smollm2, int8_report):
    """The same int8 cache with its keys stored as they come (the rotation switched off)."""
    report = int8_report
    assert report["reference_kv_dtype"] == "fp32" and report["tokens"] > 1000
    session = Session.load(LoadRequest(str(smollm2), "fp32", "int8", device="cpu"))
    ids = list(session.lm.tokenizer(TEXT.read_text(encoding="utf-8"))["input_ids"])
    assert session.cache.key_rotation is not None
    session.cache.key_rotation = None
    plain = perplexity(session, ids).perplexity / report["reference_perplexity"] - 1
    assert report["perplexity_change"] < plain, (report, plain)
