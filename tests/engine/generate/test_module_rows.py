"""Models that run through transformers' own modules (Gemma's family, and any family loaded with
the fast path off) run in the batch loop like every other: requests submitted together give,
token for token, what transformers' generate() gives each (fp32 greedy on the CPU), their rows
run in the same steps; prompt-lookup verify rows of several such requests in one step each give
plain greedy's tokens."""

from __future__ import annotations

import pytest

from engine.events import LoadRequest, SamplingParams
from engine.generate.session import Session
from tests.engine.generate.test_batch_run import Run, request
from tests.engine.generate.test_speculation_in_batch import (  # noqa: F401 (a fixture)
    COPY,
    lookup,
    oracle,
    verified_rounds,
)
from tests.engine.helpers import hf_greedy

PROMPTS = ("The quick brown fox explains the zipfile module", "hello hello world of the")
N_NEW = 24

# (tiny model, eager): Gemma's family is off the fast path; Llama's is on it, loaded eagerly
THROUGH_MODULES = (("gemma", False), ("llama", True))


@pytest.fixture(scope="module")
def sessions(tiny_models, one_thread):
    out = {}
    for arch, eager in THROUGH_MODULES:
        s = Session.load(LoadRequest(str(tiny_models[arch]), device="cpu", eager=eager))
        assert s.decoder.mode == "generic" and s.decoder.family is None
        out[arch] = s
    return out


@pytest.mark.parametrize("arch", [a for a, _ in THROUGH_MODULES])
def test_requests_together_equal_transformers_generate(arch, sessions, tiny_models):
    expected = [hf_greedy(tiny_models[arch], p, N_NEW) for p in PROMPTS]
    run = Run(sessions[arch])
    try:
        for i, p in enumerate(PROMPTS):
            run.submit(f"r{i}", request(0, prompt=p, max_new_tokens=N_NEW,
                                        sampling=SamplingParams(temperature=0.0)))
        assert [run.tokens(f"r{i}") for i in range(len(PROMPTS))] == expected
        assert max(run.engine.batch.rows_seen) == 2  # both rows in one step
        assert all(run.end(f"r{i}").reason == "max_tokens" for i in range(len(PROMPTS)))
    finally:
        run.close()


def test_lookup_rows_through_transformers_modules_give_plain_greedy(sessions, oracle):  # noqa: F811
    s = sessions["gemma"]
    s.adaptive, s.switch_off = False, False  # a round every step: the rows under test
    prompts = [COPY, "a b c d a b c d a b c d a b", "red green blue red green blue red green"]
    try:
        expected = oracle(s, [(p, 20) for p in prompts])
        run = Run(s)
        try:
            for i, p in enumerate(prompts):
                run.submit(f"s{i}", lookup(i, prompt=p, max_new_tokens=20))
            assert [run.tokens(f"s{i}") for i in range(len(prompts))] == expected
            assert verified_rounds(run) == len(prompts)
            assert max(run.engine.batch.spec.passes) == 1  # verify rows one at a time
        finally:
            run.close()
    finally:
        s.adaptive, s.switch_off = True, True
