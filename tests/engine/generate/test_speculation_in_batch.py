"""Prompt lookup speculates inside the batch, beside plain rows (batch/speculative_rows.py):
a speculative request among plain ones gives its tokens alone (plain greedy, token for token,
fp32 on the CPU) and so do the plain ones; several speculative requests at once each give
theirs; a speculative request preempted and recomputed gives an uninterrupted run's tokens; a
cancel mid-speculation ends it cleanly and the others run on; a sampled speculative request
gives the same tokens for the same seed whatever runs beside it.

A tiny random model never repeats itself, so prompt lookup would find little to propose: the
proposer is replaced by an oracle that proposes the plain greedy answer with every third token
wrong, so rounds accept runs of proposals, reject some and add the target's own token."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.batch import speculative_rows
from engine.events import Finished, LoadRequest, SamplingParams
from engine.generate.session import Session
from tests.engine.generate.test_batch_run import Run, alone, request


class Oracle:
    """A proposer that knows each prompt's plain greedy answer (`answers`, by prompt ids) and
    proposes it, every third position wrong; nothing for a prompt it does not know."""

    name = "prompt_lookup"
    answers: dict[tuple[int, ...], list[int]] = {}

    def __init__(self, device):
        self.device, self.prompt = device, ()

    def start(self, ids):
        self.prompt = tuple(ids)

    def propose(self, seq, k, sampler, grammar=None):
        answer = self.answers.get(self.prompt)
        if answer is None:
            return None, None
        ref = list(self.prompt) + answer
        out = [t if (len(seq) + i) % 3 else t + 1 for i, t in enumerate(ref[len(seq):][:k])]
        return (torch.tensor(out, device=self.device), None) if out else (None, None)

    def commit(self, accepted, proposed):
        pass


@pytest.fixture
def oracle(monkeypatch):
    """expect(session, [(prompt, max_new_tokens)]) -> each one's plain greedy answer alone,
    which the oracle then proposes."""
    monkeypatch.setattr(speculative_rows, "PromptLookup", Oracle)
    Oracle.answers = {}

    def expect(session, asks):
        answers = alone(session, [request(0, prompt=p, max_new_tokens=n,
                                          sampling=SamplingParams(temperature=0.0))
                                  for p, n in asks])
        for (p, _), answer in zip(asks, answers, strict=True):
            Oracle.answers[tuple(session.lm.tokenizer(p)["input_ids"])] = answer
        return answers
    return expect


@pytest.fixture(scope="module")
def llama(tiny_models, one_thread):
    s = Session.load(LoadRequest(str(tiny_models["llama"]), device="cpu"))
    s.adaptive, s.switch_off = False, False  # a round every step: the rows under test
    yield s
    s.adaptive, s.switch_off = True, True


COPY = ("one two three four five six seven one two three four five six seven one two three "
        "four five six seven one two three")


def lookup(i: int, **kw) -> object:
    return request(i, prompt_lookup=True, num_speculative_tokens=4,
                   sampling=SamplingParams(temperature=0.0), **kw)


def submit_beside(run: Run, spec, plain: list) -> None:
    """The plain requests first ("p0", "p1", ...), then "spec" once the first of them decodes."""
    for i, r in enumerate(plain):
        run.submit(f"p{i}", r)
    run.wait("p0", first_token=True)
    run.submit("spec", spec)


def verified_rounds(run: Run) -> int:
    """Requests that accepted proposals and saw some rejected."""
    return sum(0 < e.stats.accepted_draft_tokens < e.stats.proposed_draft_tokens
               for events in run.events.values()
               for e in events if isinstance(e, Finished) and e.stats is not None)


def test_a_speculative_row_beside_plain_rows_gives_its_tokens_alone(llama, oracle):
    spec = lookup(0, prompt=COPY, max_new_tokens=40)
    plain = [request(i, max_new_tokens=30) for i in (1, 2, 3)]  # sampled, greedy, sampled
    expected = oracle(llama, [(COPY, 40)]) + alone(llama, plain)
    run = Run(llama)
    try:
        submit_beside(run, spec, plain)
        assert run.tokens("spec") == expected[0]
        assert [run.tokens(f"p{i}") for i in range(3)] == expected[1:]
        end = run.end("spec")
        assert end.stats.speculation == "prompt_lookup"
        assert end.stats.proposed_draft_tokens > 0 and end.stats.accepted_draft_tokens > 0
        assert max(run.engine.batch.rows_seen) >= 2  # plain rows ran together beside it
    finally:
        run.close()


def test_several_speculative_requests_at_once_each_give_plain_greedy(llama, oracle):
    prompts = [COPY, "a b c d a b c d a b c d a b", "red green blue red green blue red green",
               COPY + " four"]
    reqs = [lookup(i, prompt=p, max_new_tokens=24 + 4 * i) for i, p in enumerate(prompts)]
    expected = oracle(llama, [(p, 24 + 4 * i) for i, p in enumerate(prompts)])
    run = Run(llama)
    try:
        for i, r in enumerate(reqs):
            run.submit(f"s{i}", r)
        assert [run.tokens(f"s{i}") for i in range(4)] == expected
        assert verified_rounds(run) == 4
        assert max(run.engine.batch.spec.passes) >= 2  # verify rows in one pass together
    finally:
        run.close()


def test_a_preempted_speculative_request_gives_an_uninterrupted_runs_tokens(tiny_models,
                                                                            one_thread, oracle):
    # an arena of 8 blocks for 3 requests that need 4-6 each: the newest running sequences
    # give their blocks back and are recomputed later
    s = Session.load(LoadRequest(str(tiny_models["llama"]), device="cpu", context=128,
                                 kv_tokens=16))
    s.adaptive, s.switch_off = False, False
    assert s.cache.num_blocks == 8
    prompts = [COPY, COPY[:60], COPY[20:]]
    reqs = [lookup(i, prompt=p, max_new_tokens=40) for i, p in enumerate(prompts)]
    expected = oracle(s, [(p, 40) for p in prompts])
    run = Run(s)
    try:
        for i, r in enumerate(reqs):
            run.submit(f"s{i}", r)
        assert [run.tokens(f"s{i}") for i in range(3)] == expected
        assert run.engine.batch.scheduler.num_preemptions > 0
        assert verified_rounds(run) == 3
    finally:
        run.close()


def test_cancel_mid_speculation_ends_cleanly_and_the_others_run_on(llama, oracle):
    other = request(2, max_new_tokens=40)
    expected = alone(llama, [other])[0]
    again = oracle(llama, [(COPY, 200)])[0][:20]
    run = Run(llama)
    try:
        run.submit("other", other)
        run.submit("spec", lookup(0, prompt=COPY, max_new_tokens=200))
        run.wait("spec", first_token=True)
        run.engine.cancel("spec")
        end = run.end("spec")
        assert isinstance(end, Finished) and end.reason in ("cancelled", "max_tokens")
        assert sum(isinstance(e, Finished) for e in run.events["spec"]) == 1
        assert run.tokens("other") == expected
        run.submit("again", lookup(0, prompt=COPY, max_new_tokens=20))
        assert run.tokens("again") == again
        assert not run.engine.batch.spec.rows  # nothing left of the cancelled one
    finally:
        run.close()


def test_a_sampled_speculative_request_keeps_its_seed(llama, oracle):
    """Seeded sampling with proposals in a batch: the same seed gives the same tokens beside
    other rows as in a batch of one (the accept rule draws from its generator alone)."""
    oracle(llama, [(COPY, 30)])
    sampled = request(1, prompt=COPY, prompt_lookup=True, num_speculative_tokens=4,
                      max_new_tokens=30)
    run = Run(llama)
    try:
        run.submit("first", sampled)
        first = run.tokens("first")
        run.submit("p", request(2, max_new_tokens=40))
        run.wait("p", first_token=True)
        run.submit("second", sampled)
        assert run.tokens("second") == first
        assert len(first) == 30
        assert run.end("second").stats.proposed_draft_tokens > 0
    finally:
        run.close()


def test_constrained_lookup_rows_with_logprobs_equal_plain_constrained_greedy(tiny_models,
                                                                               one_thread):
    """Real prompt lookup over compact JSON, under each request's grammar and with logprobs:
    three such requests at once beside a plain sampled row each give plain constrained greedy's
    tokens alone, and each token's logprobs those of its plain step (fp32 rounding of a block
    against single steps); proposals were accepted and rejected."""
    from tests.engine.spec.test_constrained_speculation import (
        ROUNDING,
        SCHEMAS,
        logprobs_of,
    )
    from tests.engine.spec.test_constrained_speculation import request as constrained

    s = Session.load(LoadRequest(str(tiny_models["qwen2"]), device="cpu", context=512))
    s.adaptive, s.switch_off = False, False
    reqs = [constrained(SCHEMAS[i], max_new_tokens=40,
                        sampling=SamplingParams(temperature=0.0, logprobs=3)) for i in (1, 2, 3)]
    expected = [list(s.generate(r)) for r in reqs]
    run = Run(s)
    try:
        run.submit("plain", request(1, max_new_tokens=30))
        for i, r in enumerate(reqs):
            run.submit(f"c{i}", replace(r, prompt_lookup=True))
        ends = [run.end(f"c{i}") for i in range(3)]
        for i, ref in enumerate(expected):
            assert run.tokens(f"c{i}") == [t for e in ref if hasattr(e, "token_ids")
                                          for t in e.token_ids]
            mine, theirs = logprobs_of(run.events[f"c{i}"]), logprobs_of(ref)
            assert len(mine) == len(theirs)
            for (lp, top), (ref_lp, ref_top) in zip(mine, theirs, strict=True):
                assert [t for t, _ in top] == [t for t, _ in ref_top]
                torch.testing.assert_close(torch.tensor([lp, *(v for _, v in top)]),
                                           torch.tensor([ref_lp, *(v for _, v in ref_top)]),
                                           rtol=0, atol=ROUNDING)
    finally:
        run.close()
    accepted = sum(e.stats.accepted_draft_tokens for e in ends)
    assert 0 < accepted < sum(e.stats.proposed_draft_tokens for e in ends)


def test_with_its_switch_off_on_a_request_steps_aside_while_others_share_the_batch(
        llama, oracle, monkeypatch):
    """The default (switch-off on): verify rows only where the request is the batch's one
    sequence (beside plain rows they cost more than they return on the CPU); its answer is
    still its plain greedy one, and alone it speculates. Its controller is one that would
    propose every step, so only the crowd holds it back."""

    class Eager(speculative_rows.Controller):
        def next_k(self, limit: int) -> int:
            return min(4, limit)

    monkeypatch.setattr(speculative_rows, "Controller", Eager)
    spec = lookup(0, prompt=COPY, max_new_tokens=16)
    plain = [request(i, max_new_tokens=48) for i in (1, 2)]
    expected = oracle(llama, [(COPY, 16)]) + alone(llama, plain)
    llama.switch_off = True
    run = Run(llama)
    try:
        submit_beside(run, spec, plain)
        assert run.tokens("spec") == expected[0]
        assert run.end("spec").stats.proposed_draft_tokens == 0  # it ended beside them
        assert [run.tokens(f"p{i}") for i in range(2)] == expected[1:]
        run.submit("alone", lookup(3, prompt=COPY, max_new_tokens=16))
        assert run.tokens("alone") == expected[0]
        assert run.end("alone").stats.proposed_draft_tokens > 0
    finally:
        llama.switch_off = False
        run.close()
