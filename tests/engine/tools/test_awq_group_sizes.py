"""AWQ for models whose widths are not multiples of 128: `hearth quantize`
takes --group-size 32, 64 or 128, by default the largest that divides every linear's inputs, and
the copy loads and runs through the int4 kernels. SmolLM2-135M (576 and 1536: group 64) was
refused before; here its AWQ copy answers, and its perplexity is lower than plain rounding's."""

from __future__ import annotations

import json

import pytest

from engine.cli import cli
from engine.events import BadRequest, LoadRequest
from engine.generate.session import Session
from engine.tools.eval import perplexity
from engine.tools.quantize import group_size_for
from tests.engine.test_smollm2 import TEXT

SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, head_dim=64)
QWEN_7B = dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28)


def test_the_default_group_is_the_largest_that_divides_every_width():
    assert group_size_for(SMOLLM2) == 64
    assert group_size_for(QWEN_7B) == 128
    assert group_size_for(dict(hidden_size=96, intermediate_size=160)) == 32
    assert group_size_for(SMOLLM2, 32) == 32


@pytest.mark.parametrize("config, asked, words", [
    (SMOLLM2, 128, "does not divide the model's widths (576, 1536); 64 does"),
    (SMOLLM2, 96, "takes 128, 64, 32"),
    (dict(hidden_size=48, intermediate_size=128), None, "multiples of none"),
])
def test_groups_that_do_not_fit_are_refused_in_a_sentence(config, asked, words):
    with pytest.raises(BadRequest, match=words.replace("(", r"\(").replace(")", r"\)")):
        group_size_for(config, asked)


@pytest.fixture(scope="module")
def smol_copies(smollm2, tmp_path_factory, one_thread):
    """SmolLM2 rounded to 4 bits (rtn) and AWQ-searched on a little calibration text."""
    root = tmp_path_factory.mktemp("smol-awq")
    out = {}
    for method, extra in (("rtn", []), ("awq", ["--num-samples", "4", "--seq-len", "64"])):
        out[method] = root / method
        assert cli.main(["quantize", "--model", str(smollm2), "--method", method, "--out",
                         str(out[method]), "--device", "cpu", *extra]) == 0
    return out


def test_smollm2_quantizes_in_groups_of_64_and_answers(smol_copies, capsys):
    config = json.loads((smol_copies["awq"] / "config.json").read_text())
    assert config["quantization_config"]["group_size"] == 64
    assert cli.main(["run", "--model", str(smol_copies["awq"]), "--prompt", "What is 2 + 2?",
                     "--max-new-tokens", "12", "--temperature", "0", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.strip()


def test_awq_beats_plain_rounding_on_smollm2(smol_copies, smollm2):
    ppl = {}
    for name, folder in (("bf16", smollm2), *smol_copies.items()):
        session = Session.load(LoadRequest(str(folder), device="cpu"))
        assert session.lm.quant == ("bf16" if name == "bf16" else "awq")
        ids = list(session.lm.tokenizer(TEXT)["input_ids"])
        ppl[name] = perplexity(session, ids).perplexity
    assert ppl["bf16"] < ppl["awq"] < ppl["rtn"], ppl
