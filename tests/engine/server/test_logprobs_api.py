"""logprobs, top_logprobs, presence and frequency penalties and logit_bias through the `openai`
SDK against a `hearth serve` subprocess (the demo model in fp32): OpenAI's shapes on chat and
completions, streamed equal to whole, the values the log_softmax of transformers' own logits,
a bias that forces a token, and a seeded answer with penalties that repeats."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.engine.helpers import hearth_serve

DEMO = Path(__file__).resolve().parents[3] / "hearth_resources" / "demo_model"
QUESTION = [{"role": "user", "content": "What does `locale.getlocale` do?"}]
PROMPT_IDS = [74, 387, 81, 290, 84, 802, 16, 223]


@pytest.fixture(scope="module")
def client():
    proc, url = hearth_serve("--quant", "fp32")
    try:
        yield openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
    finally:
        proc.kill()
        proc.wait()


def chat(client, **kw):
    return client.chat.completions.create(model="demo_model", messages=QUESTION,
                                          temperature=0, max_tokens=10, **kw)


def test_chat_logprobs_in_openais_shape_streamed_equal_whole(client):
    whole = chat(client, logprobs=True, top_logprobs=3)
    choice = whole.choices[0]
    content = choice.logprobs.content
    assert len(content) == whole.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert [t.logprob for t in entry.top_logprobs] == sorted(
            (t.logprob for t in entry.top_logprobs), reverse=True)
        best = entry.top_logprobs[0]  # greedy: the chosen token is the likeliest
        assert (entry.token, entry.bytes, entry.logprob) == (best.token, best.bytes,
                                                            best.logprob)
    text = bytes(b for entry in content for b in entry.bytes).decode()
    assert text.startswith(choice.message.content)  # the end token's own bytes may follow
    if choice.finish_reason == "length":
        assert text == choice.message.content

    chunks = list(chat(client, logprobs=True, top_logprobs=3, stream=True))
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs
                for e in ch.choices[0].logprobs.content]
    assert [(e.token, e.bytes) for e in streamed] == [(e.token, e.bytes) for e in content]
    # the second pass finds the prompt cached: its logits may differ in the last bits
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content],
                                                          abs=1e-4)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == \
        choice.message.content
    assert chat(client).choices[0].logprobs is None  # none asked, none given


def test_completion_logprobs_are_the_log_softmax_of_the_models_logits(client):
    whole = client.completions.create(model="demo_model", prompt=PROMPT_IDS, temperature=0,
                                      max_tokens=6, logprobs=2)
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(len(top) <= 2 for top in lp.top_logprobs)

    model = AutoModelForCausalLM.from_pretrained(DEMO, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(DEMO)
    ids = list(PROMPT_IDS)
    with torch.no_grad():
        for step in range(6):  # greedy, teacher-forced on the reference's own choices
            expected = model(torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)
            best = int(expected.argmax())
            assert lp.token_logprobs[step] == pytest.approx(expected[best].item(), abs=1e-3)
            assert max(lp.top_logprobs[step].values()) == pytest.approx(
                expected[best].item(), abs=1e-3)
            ids.append(best)
    assert whole.choices[0].text == tok.decode(ids[len(PROMPT_IDS):])

    chunks = list(client.completions.create(model="demo_model", prompt=PROMPT_IDS,
                                            temperature=0, max_tokens=6, logprobs=2,
                                            stream=True))
    parts = [ch.choices[0].logprobs for ch in chunks if ch.choices and ch.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [t for p in parts for t in p.token_logprobs] == pytest.approx(lp.token_logprobs,
                                                                         abs=1e-4)
    assert [t for p in parts for t in p.text_offset] == lp.text_offset


def test_logit_bias_forces_a_token_and_penalised_seeded_answers_repeat(client):
    tok = AutoTokenizer.from_pretrained(DEMO)
    forced = client.completions.create(model="demo_model", prompt="import os", max_tokens=5,
                                       temperature=1.0, seed=5, logit_bias={"290": 100})
    assert forced.choices[0].text == tok.decode([290] * 5)
    banned = client.completions.create(model="demo_model", prompt="import os", max_tokens=5,
                                       temperature=0, logprobs=0,
                                       logit_bias={"290": -100, "81": -100})
    assert not {tok.decode([290]), tok.decode([81])} & set(banned.choices[0].logprobs.tokens)

    def penalised():
        return client.chat.completions.create(
            model="demo_model", messages=QUESTION, max_tokens=16, temperature=0.9, seed=21,
            presence_penalty=0.8, frequency_penalty=-0.5, n=2).choices

    first, again = penalised(), penalised()
    assert [c.message.content for c in first] == [c.message.content for c in again]
