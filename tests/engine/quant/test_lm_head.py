"""`--lm-head int8|int4`: a quantized copy of the lm_head, for any weight format; its logits stay
close to the 16-bit ones, the fused step uses it, and a bad value is one sentence (exit 2)."""

from __future__ import annotations

import json

import pytest
import torch

from engine.cli import cli
from engine.events import LoadRequest
from engine.generate.session import Session
from engine.quant.int8_linear import Int8Linear
from tests.engine.helpers import finished, greedy_request


def test_int8_kernel_equals_its_reference():
    w = torch.randn(96, 64, generator=torch.Generator().manual_seed(0))
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    fast = Int8Linear.quantize(w, None, torch.float32, torch.device("cpu"))
    ref = Int8Linear.quantize(w, None, torch.float32, torch.device("cpu"), kernel="reference")
    assert fast.kernel == "int8pack"
    assert torch.allclose(fast(x), ref(x), rtol=1e-5, atol=1e-5)
    # per-row symmetric rounding: half a step of max|w| / 127 at most
    assert ((fast.dequantize() - w).abs() <= w.abs().amax(1, keepdim=True) / 254 + 1e-6).all()


@pytest.mark.parametrize("how, tol", [("int8", 0.02), ("int4", 0.2)])
def test_quantized_lm_head_decodes_close_to_the_16_bit_one(how, tol, tiny_awq):
    path = str(tiny_awq["llama"]["source"])  # hidden 128: whole int4 groups
    plain = Session.load(LoadRequest(path, device="cpu", quant="fp32"))
    quant = Session.load(LoadRequest(path, device="cpu", quant="fp32", lm_head=how))
    head = quant.lm.model.get_output_embeddings()
    assert type(head).__name__ == ("Int8Linear" if how == "int8" else "Int4Linear")
    assert quant.decoder.family.lm_head is head  # the fused step reads the quantized copy
    assert any(n.startswith(f"lm_head: {how}") for n in quant.loaded_event().notes)
    ids = torch.randint(3, 2000, (24,), generator=torch.Generator().manual_seed(2))
    a, b = plain.decoder.forward(ids, 0), quant.decoder.forward(ids, 0)
    assert ((a - b).norm() / a.norm()).item() < tol
    assert finished(list(quant.generate(greedy_request(n=6)))).reason in ("max_tokens", "eos")


def test_tied_embedding_keeps_its_16_bit_table(tiny_awq):
    s = Session.load(LoadRequest(str(tiny_awq["qwen2"]["awq"]), device="cpu", lm_head="int4"))
    embed = s.lm.model.get_input_embeddings().weight
    assert embed.dtype == torch.bfloat16 and not embed.is_meta
    assert type(s.lm.model.get_output_embeddings()).__name__ == "Int4Linear"


def test_eval_reports_the_lm_head(tiny_awq, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("The zipfile module reads and writes ZIP archives. " * 20)
    model = str(tiny_awq["qwen2"]["source"])
    assert cli.main(["eval", "--model", model, "--text", str(text), "--lm-head", "int8",
                     "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["lm_head"] == "int8" and report["perplexity"] > 1
    assert cli.main(["eval", "--model", model, "--text", str(text), "--lm-head", "int2"]) == 2
    assert "--lm-head" in capsys.readouterr().err
