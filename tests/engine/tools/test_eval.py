"""`hearth eval`: strided windows score every token once, the engine's perplexity equals
transformers' own loss, a quantized KV cache is reported against the model's own cache in the
same run, and bad input is one line on stderr with exit code 2."""

from __future__ import annotations

import json
import math

import pytest
import torch

from engine.events import LoadRequest
from engine.generate.session import Session
from engine.tools.eval import perplexity, run_eval, windows

TEXT = (
    "The zipfile module reads and writes ZIP archives. Members are added with write() and "
    "read back with read(); a ZipInfo object describes each one. "
) * 6


@pytest.mark.parametrize("n, window, stride", [
    (1, 8, 4), (2, 8, 4), (8, 8, 4), (9, 8, 4), (100, 8, 4), (100, 8, 7), (100, 7, 3),
    (1000, 64, 1), (65, 64, 32),
])
def test_windows_score_every_token_once_with_context(n, window, stride):
    scored = []
    for begin, end, first in windows(n, window, stride):
        assert 0 <= begin < first < end <= n and end - begin <= window
        if begin > 0:  # past the first window a token sees at least window - stride before it
            assert first - begin >= window - stride
        scored.extend(range(first, end))
    assert scored == list(range(1, n))


@pytest.mark.parametrize("stride", [0, 4, 5])
def test_windows_must_overlap(stride):
    with pytest.raises(ValueError):
        windows(10, 4, stride)


def _reference_nll(path, ids: list[int], window: int, stride: int) -> tuple[float, int]:
    """transformers' own forward over the same windows: the oracle."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    t = torch.tensor(ids)
    nll, count = 0.0, 0
    with torch.no_grad():
        for begin, end, first in windows(len(ids), window, stride):
            logits = model(input_ids=t[None, begin:end]).logits[0]
            scored = logits[first - 1 - begin:end - 1 - begin]
            nll += float(torch.nn.functional.cross_entropy(scored, t[first:end], reduction="sum"))
            count += end - first
    return nll, count


@pytest.mark.parametrize("context, stride", [(None, None), (64, 32), (64, 17)])
def test_engine_perplexity_equals_transformers(tiny_model, context, stride):
    session = Session.load(LoadRequest(str(tiny_model), device="cpu", context=context))
    ids = list(session.lm.tokenizer(TEXT)["input_ids"])
    assert len(ids) > 2 * (context or 0)  # several windows where a context is set
    got = perplexity(session, ids, stride)
    nll, count = _reference_nll(tiny_model, ids, got.window, got.stride)
    assert got.tokens == count == len(ids) - 1
    assert got.perplexity == pytest.approx(math.exp(nll / count), rel=1e-4)


def test_run_eval_json_is_one_object(tiny_model, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert run_eval(str(tiny_model), str(text), "auto", "auto", True) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    report = json.loads(out[0])
    assert isinstance(report["perplexity"], float) and report["perplexity"] > 1
    assert isinstance(report["tokens"], int) and report["tokens"] > 50
    assert report["quant"] == "fp32" and report["device"] == "cpu"


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_run_eval_reports_a_quantized_cache_against_the_models_own(tiny_model, tmp_path, capsys,
                                                                   kv):
    """One run: the quantized cache's perplexity, the fp32 cache's over the same windows, and
    how often their most likely next tokens agree, as the engine computes them separately."""
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert run_eval(str(tiny_model), str(text), "fp32", kv, True) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kv_dtype"] == kv and report["reference_kv_dtype"] == "fp32"
    session = Session.load(LoadRequest(str(tiny_model), "fp32", "fp32", device="cpu"))
    ids = list(session.lm.tokenizer(TEXT)["input_ids"])
    want: list = []
    ref = perplexity(session, ids, predictions=want)
    assert report["reference_perplexity"] == pytest.approx(ref.perplexity, rel=1e-6)
    assert report["perplexity_change"] == pytest.approx(
        report["perplexity"] / ref.perplexity - 1, rel=1e-6, abs=1e-9)
    quantized = Session.load(LoadRequest(str(tiny_model), "fp32", kv, device="cpu"))
    got: list = []
    perplexity(quantized, ids, predictions=got)
    same = sum(int((a == b).sum()) for a, b in zip(got, want, strict=True))
    assert report["top1_agreement"] == same / report["tokens"]
    assert 0.5 < report["top1_agreement"] <= 1


def test_run_eval_of_a_16bit_cache_has_nothing_to_compare(tiny_model, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert run_eval(str(tiny_model), str(text), "fp32", "fp32", True) == 0
    report = json.loads(capsys.readouterr().out)
    assert "top1_agreement" not in report and "reference_perplexity" not in report


def test_run_eval_human_line(tiny_model, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert run_eval(str(tiny_model), str(text), "bf16", "bf16", False) == 0
    out = capsys.readouterr().out
    assert out.startswith("perplexity ") and "bf16 weights" in out and len(out.splitlines()) == 1


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    return lines[0]


@pytest.mark.parametrize("case, words", [
    ("missing", "does not exist"), ("folder", "not a file"), ("empty", "empty"),
    ("latin1", "not UTF-8"), ("one_token", "at least 2"),
])
def test_bad_text_file(case, words, tiny_model, tmp_path, capsys):
    path = tmp_path / case
    if case == "folder":
        path.mkdir()
    elif case == "empty":
        path.write_text("  \n")
    elif case == "latin1":
        path.write_bytes("café crème".encode("latin-1"))
    elif case == "one_token":
        path.write_text("a")
    assert run_eval(str(tiny_model), str(path), "auto", "auto", True) == 2
    assert words in _one_error_line(capsys)


@pytest.mark.parametrize("quant, kv_dtype, words", [
    ("q5", "auto", "--quant"), ("auto", "int3", "--kv-dtype"),
])
def test_bad_settings(quant, kv_dtype, words, tiny_model, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    assert run_eval(str(tiny_model), str(text), quant, kv_dtype, False) == 2
    assert words in _one_error_line(capsys)


def test_bad_model_folder(bad_models, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    assert run_eval(str(bad_models["gguf"]), str(text), "auto", "auto", False) == 2
    assert "GGUF" in _one_error_line(capsys)
