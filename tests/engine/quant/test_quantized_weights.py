"""NF4 and INT8 (bitsandbytes) load and generate on CPU, in less memory than bf16."""

from __future__ import annotations

import pytest

from engine.events import LoadRequest
from engine.generate.session import Session
from tests.engine.helpers import finished, greedy_request, token_ids


@pytest.fixture(scope="module")
def bf16_bytes(tiny_model):
    return Session.load(LoadRequest(str(tiny_model), quant="bf16", device="cpu")).lm.weights_bytes


@pytest.mark.parametrize("quant", ["nf4", "int8"])
def test_quantized_loads_generates_and_is_smaller(quant, tiny_model, bf16_bytes):
    session = Session.load(LoadRequest(str(tiny_model), quant=quant, device="cpu"))
    assert session.loaded_event().quant == quant
    linear_types = {type(m).__name__ for m in session.lm.model.modules()}
    assert ("Linear4bit" if quant == "nf4" else "Linear8bitLt") in linear_types
    events = list(session.generate(greedy_request(n=16)))
    assert finished(events).reason in ("max_tokens", "eos")
    assert len(token_ids(events)) >= 1
    assert session.lm.weights_bytes < bf16_bytes
