"""A random-weight model of one shape speaking through another model's tokenizer: its vocabulary
is the tokenizer's, its weights the same on every load, and its greedy ids decode through the
chat template to text."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.events import GenerateRequest, LoadRequest, SamplingParams, Token
from engine.generate.session import Session
from engine.tools.bench.random_chat_model import random_chat_model

DEMO = Path(__file__).resolve().parents[3] / "hearth_resources" / "demo_model"


def test_a_shape_with_the_demo_tokenizer_talks_and_loads_the_same_twice(tmp_path):
    config = json.loads((DEMO / "config.json").read_text())
    config["vocab_size"] = 7  # the shape's own vocabulary gives way to the tokenizer's
    (tmp_path / "config.json").write_text(json.dumps(config))
    req = LoadRequest(model=str(tmp_path), device="cpu", quant="fp32")
    first, second = (random_chat_model(tmp_path, DEMO, req) for _ in range(2))
    assert first.model.config.vocab_size == len(first.tokenizer) > 7
    theirs = second.model.state_dict()
    for name, weight in first.model.state_dict().items():
        assert torch.equal(weight, theirs[name])
    ask = GenerateRequest(messages=({"role": "user", "content": "hello"},), max_new_tokens=6,
                          sampling=SamplingParams(temperature=0))
    texts = ["".join(e.text for e in Session(lm).generate(ask) if isinstance(e, Token))
             for lm in (first, second)]
    assert texts[0] and texts[0] == texts[1]
