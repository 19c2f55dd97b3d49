"""Prefill chunks of several sequences in one pass (models/prefill_batch.py): the same
tokens as each request alone, token for token, in fp32 on CPU, where both take the family step
for their prefill (on a GPU the decode kernel's condition; here the step's SDPA attention, forced
for the alone runs and the batch alike), with chunks that start mid-prompt, past cached blocks and
at odd lengths; and the pass really ran over several sequences."""

from __future__ import annotations

import pytest

from engine.events import LoadRequest
from engine.generate.session import Session
from engine.step.decode import Decoder
from tests.engine.generate.test_batch_run import Run, alone, concurrent_equals_alone, request
from tests.fixtures.tiny import ARCHITECTURES


@pytest.fixture
def family_prefill(monkeypatch):
    """Every prefill chunk through the family step, as on a GPU with the decode kernel."""
    monkeypatch.setattr(Decoder, "family_prefills",
                        lambda self, start, T: self.family is not None)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_chunks_of_several_sequences_in_one_pass_give_what_each_gives_alone(
        arch, tiny_models, one_thread, family_prefill):
    s = Session.load(LoadRequest(str(tiny_models[arch]), device="cpu"))
    if s.decoder.family is None:
        pytest.skip("transformers' modules: no family step to run chunks together")
    run = concurrent_equals_alone(s)
    passes = run.engine.batch.prefill_passes
    assert max(passes) >= 3, passes  # several sequences' chunks in one pass


def test_long_prompts_in_chunks_mid_prompt_and_past_a_shared_start(tiny_models, one_thread,
                                                                   family_prefill):
    """A 32-token budget: 150- and 97-token prompts arrive together and go in chunks that start
    mid-prompt, side by side in one pass; two share their first 64 tokens (cached blocks)."""
    s = Session.load(LoadRequest(str(tiny_models["qwen2"]), device="cpu", context=512))
    s.prefill_chunk = 32
    shared = list(range(5, 69))
    prompts = [tuple(shared + list(range(300, 386))), tuple(range(7, 104)),
               tuple(shared + list(range(400, 433)))]
    reqs = [request(i, prompt_ids=p, prompt=None, max_new_tokens=6)
            for i, p in enumerate(prompts)]
    expected = alone(s, reqs)
    s.cache.clear()
    run = Run(s)
    try:
        for i, r in enumerate(reqs):
            run.submit(f"p{i}", r)
        assert [run.tokens(f"p{i}") for i in range(3)] == expected
    finally:
        run.close()
    assert max(run.engine.batch.prefill_passes) >= 2
