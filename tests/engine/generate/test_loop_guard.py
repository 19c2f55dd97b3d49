"""The loop guard: a span repeated back to back ends the answer as soon as the loop is long
enough, with the finish reason "repetition", in a session of one (plain and speculative steps)
and in a continuous batch; an answer that does not repeat itself is never cut; the guard is off
unless the request asks for it, and never with ignore_eos."""

from __future__ import annotations

import dataclasses
import json.encoder
import random
from pathlib import Path

import pytest

from engine.events import Finished, GenerateRequest, LoadRequest, SamplingParams, Token
from engine.generate.loop_guard import (
    MAX_PERIOD,
    MIN_LOOP_TOKENS,
    end_reason,
    loop_span,
    repeats,
)
from engine.generate.session import Session
from tests.engine.generate.test_batch_run import Run
from tests.fixtures import looping

SENTENCE = list(range(100, 120))  # a 20-token span


def first_loop(ids: list[int]) -> int | None:
    """The number of tokens after which the guard first sees a loop, asked token by token."""
    return next((n for n in range(1, len(ids) + 1) if repeats(ids[:n])), None)


def test_a_sentence_said_four_times_is_a_loop_at_its_fourth_end():
    answer = [5, 6, 7] + SENTENCE * 10
    assert first_loop(answer) == 3 + loop_span(len(SENTENCE)) == 3 + 4 * len(SENTENCE)


def test_a_short_span_counts_only_once_it_fills_min_loop_tokens():
    zeros = [30, 31] * 40  # "0," over and over: a row of an array before it is a loop
    assert first_loop(zeros) == MIN_LOOP_TOKENS
    assert first_loop([9] * 100) == MIN_LOOP_TOKENS


def test_three_copies_and_longer_spans_than_max_period_are_no_loop():
    assert first_loop([1, 2] + SENTENCE * 3 + [1, 2]) is None
    long_span = list(range(1000, 1000 + MAX_PERIOD + 1))
    assert first_loop(long_span * 5) is None


def test_an_answer_that_does_not_repeat_itself_is_never_cut(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    # code and its comments: repeated words, lines and blank lines, but no span said over and
    # over
    text = Path(json.encoder.__file__).read_text()
    ids = tok(text)["input_ids"]
    assert len(ids) > 3000
    assert first_loop(ids) is None
    rng = random.Random(0)
    assert first_loop([rng.randrange(50) for _ in range(3000)]) is None


def test_the_guard_is_off_unless_asked_and_never_with_ignore_eos():
    loop = [9] * 100
    ask = GenerateRequest(prompt="x", stop_on_repetition=True)
    assert GenerateRequest(prompt="x").stop_on_repetition is False
    assert end_reason(GenerateRequest(prompt="x"), loop, False, 0, 1) is None
    assert end_reason(ask, loop, False, 0, 1) == "repetition"
    assert end_reason(GenerateRequest(prompt="x", stop_on_repetition=True, ignore_eos=True),
                      loop, False, 0, 1) is None
    assert end_reason(ask, loop, True, 1, 1) == "stop_string"
    assert end_reason(ask, [1, 2, 3], False, 1, 1) == "max_tokens"


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def looping_model(tiny_models, tmp_path_factory):
    return looping.build(tiny_models["llama"], tmp_path_factory.mktemp("looping") / "model")


@pytest.fixture(scope="module")
def loop_session(looping_model, one_thread):
    return Session.load(LoadRequest(str(looping_model[0]), device="cpu"))


def greedy(cycle: list[int], guard: bool, **kw) -> GenerateRequest:
    return GenerateRequest(prompt_ids=(cycle[0],), max_new_tokens=300, stop_on_repetition=guard,
                           sampling=SamplingParams(temperature=0.0), **kw)


def answer(session, req) -> tuple[list[int], Finished]:
    events = list(session.generate(req))
    return [t for e in events if isinstance(e, Token) for t in e.token_ids], events[-1]


def test_a_looping_model_is_cut_where_the_loop_is_plain(loop_session, looping_model):
    cycle = looping_model[1]
    free, free_end = answer(loop_session, greedy(cycle, guard=False))
    assert free_end.reason == "max_tokens" and len(free) == 300
    assert free[:len(cycle)] == cycle[1:] + cycle[:1]  # the fixture loops from the first token
    cut, end = answer(loop_session, greedy(cycle, guard=True))
    assert end.reason == "repetition" and end.stats.new_tokens == len(cut)
    assert cut == free[:loop_span(looping.PERIOD)]


def test_speculative_rounds_are_cut_at_the_same_token(loop_session, looping_model):
    """Prompt lookup proposes the loop itself: rounds of several tokens, cut mid-round."""
    cycle = looping_model[1]
    plain, _ = answer(loop_session, greedy(cycle, guard=True))
    spec, end = answer(loop_session, greedy(cycle, guard=True, prompt_lookup=True,
                                            num_speculative_tokens=7))
    assert end.reason == "repetition" and end.stats.proposed_draft_tokens > 0
    assert spec == plain


def test_a_batch_cuts_the_looping_request_and_runs_the_other_on(loop_session, looping_model):
    cycle = looping_model[1]
    alone, _ = answer(loop_session, greedy(cycle, guard=True))
    run = Run(loop_session)
    try:
        run.submit("guarded", greedy(cycle, guard=True))
        run.submit("free", greedy(cycle, guard=False))
        assert run.end("guarded").reason == "repetition"
        assert run.tokens("guarded") == alone
        assert run.end("free").reason == "max_tokens" and len(run.tokens("free")) == 300
    finally:
        run.close()


def test_a_wandering_answer_runs_to_its_limit(tiny_model, one_thread):
    """The tiny random models wander (tests/fixtures/tiny.py): the guard leaves them alone."""
    s = Session.load(LoadRequest(str(tiny_model), device="cpu"))
    req = GenerateRequest(prompt="The quick brown fox", raw=True, max_new_tokens=400,
                          sampling=SamplingParams(temperature=0.0), stop_on_repetition=True)
    guarded, end = answer(s, req)
    assert end.reason == "max_tokens" and len(guarded) == 400
    free, _ = answer(s, dataclasses.replace(req, stop_on_repetition=False))
    assert guarded == free


def test_a_batch_cuts_a_speculating_looping_request_at_the_same_token(loop_session,
                                                                     looping_model):
    """Prompt lookup inside a batch proposes the loop: its rounds commit several tokens at once,
    and the guard still cuts the answer at the token it cuts it alone (the rest of the round
    is not given out), beside a request that runs on."""
    cycle = looping_model[1]
    alone, _ = answer(loop_session, greedy(cycle, guard=True))
    loop_session.switch_off = False  # rounds beside the other request, not only alone
    run = Run(loop_session)
    try:
        run.submit("free", greedy(cycle, guard=False))
        run.submit("lookup", greedy(cycle, guard=True, prompt_lookup=True,
                                    num_speculative_tokens=7))
        end = run.end("lookup")
        assert end.reason == "repetition" and end.stats.accepted_draft_tokens > 0
        assert run.tokens("lookup") == alone and end.stats.new_tokens == len(alone)
        assert run.end("free").reason == "max_tokens" and len(run.tokens("free")) == 300
    finally:
        loop_session.switch_off = True
        run.close()
