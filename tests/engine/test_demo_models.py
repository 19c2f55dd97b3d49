"""The bundled demo models: they pass the folder check, fit the size budget, load through the
engine and generate; the tokenizer round-trips; `hearth eval` reproduces the model card."""

from __future__ import annotations

import json
import math
import re

import pytest

from engine.events import Finished, GenerateRequest, LoadRequest, SamplingParams, Token
from engine.files.model_folder import DEMO_MODEL_DIR, check, resolve
from engine.generate.session import Session
from engine.tools.eval import run_eval
from tests.engine.helpers import REPO

DEMO = REPO / "hearth_resources" / "demo_model"
DRAFT = REPO / "hearth_resources" / "demo_draft"
RECIPE = REPO / "packaging" / "demo_model"
HELDOUT = RECIPE / "heldout.txt"
CARD = DEMO / "README.md"
MAX_BUNDLED_BYTES = 12_000_000  # every tracked file travels to the GPU machine
QUESTION = "What does `copy.copy` do?"  # its docstring is in the held-out split


def _count_parameters(path) -> int:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def test_folders_pass_the_check_and_fit_the_budget():
    target, draft = check(str(DEMO)), check(str(DRAFT))
    assert resolve(None) == DEMO_MODEL_DIR == DEMO  # the default when --model is left out
    assert target.architecture == draft.architecture == "Qwen2ForCausalLM"
    sizes = [(p / "model.safetensors").stat().st_size for p in (DEMO, DRAFT)]
    assert sum(sizes) <= MAX_BUNDLED_BYTES
    cfg, dcfg = target.config, draft.config
    assert cfg["max_position_embeddings"] >= 1024
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]  # grouped-query attention
    assert dcfg["num_hidden_layers"] <= 2 and dcfg["vocab_size"] == cfg["vocab_size"]
    assert cfg["dtype"] == dcfg["dtype"] == "bfloat16"
    assert 4_000_000 <= _count_parameters(DEMO) <= 5_000_000
    assert 500_000 <= _count_parameters(DRAFT) <= 1_000_000
    tokenizers = {(p / "tokenizer.json").read_bytes() for p in (DEMO, DRAFT, RECIPE / "tokenizer")}
    assert len(tokenizers) == 1  # one tokenizer: the draft's proposals are the target's ids
    for path in (DEMO, DRAFT):
        gen = json.loads((path / "generation_config.json").read_text())
        assert gen["eos_token_id"][0] == 2  # <|im_end|> ends an answer


@pytest.fixture(scope="module")
def demo_session():
    return Session.load(LoadRequest(None, device="cpu"))  # no model given: the demo model


def _greedy(session, **kw) -> list:
    req = GenerateRequest(max_new_tokens=48, sampling=SamplingParams(temperature=0.0), **kw)
    return list(session.generate(req))


def test_demo_model_answers_a_heldout_question(demo_session):
    events = _greedy(demo_session, prompt=QUESTION)
    assert isinstance(events[-1], Finished) and events[-1].reason in ("eos", "max_tokens")
    answer = "".join(e.text for e in events if isinstance(e, Token))
    assert len(answer.split()) >= 3
    assert demo_session.lm.quant == "bf16"  # on CPU the checkpoint's own dtype


def test_demo_draft_loads_and_generates():
    session = Session.load(LoadRequest(str(DRAFT), device="cpu"))
    events = _greedy(session, prompt=QUESTION)
    assert isinstance(events[-1], Finished)
    assert any(isinstance(e, Token) for e in events)


@pytest.mark.parametrize("text", [
    HELDOUT.read_text(encoding="utf-8"),
    "今天天气很好，我们去公园散步吧。 café naïve Zürich 😀👍 ∑ √ ∞ \t tabs\r\nand CRLF  ",
    "def f(x):\n    return x ** 2  # ``double`` backquotes\n",
], ids=["heldout", "multibyte", "code"])
def test_tokenizer_round_trips(text):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DEMO)
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text


def test_tokenizer_special_tokens_and_chat_template():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DEMO)
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert tok.eos_token == "<|im_end|>" and len(tok) == 4096
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                        "<|im_start|>assistant\n")


def _card_perplexity(folder: str) -> float:
    match = re.search(rf"^\| {folder} \| ([0-9.]+) \|", CARD.read_text(encoding="utf-8"), re.M)
    assert match, f"the model card has no `hearth eval` row for {folder}"
    return float(match[1])


@pytest.mark.parametrize("folder", ["demo_model", "demo_draft"])
def test_eval_reproduces_the_model_card(folder, capsys):
    assert run_eval(str(REPO / "hearth_resources" / folder), str(HELDOUT), "auto", "auto",
                    True) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["perplexity"] == pytest.approx(_card_perplexity(folder), rel=0.01)
