"""A split model batches (CPU, gloo, 2 ranks): requests running together through the service
Engine give, token for token, what the unsplit model gives each alone (fp32 greedy), in batched
steps and prefill passes that every rank runs over its shard, in arenas of --kv-tokens; prompt
lookup's verify rows run inside those steps beside plain rows; a single generation is a batch
of one and gives the same tokens, speculating or not.

A tiny random model never repeats itself, so prompt lookup is replaced by the oracle of
tests/engine/generate/test_speculation_in_batch.py (the plain greedy answer, every third
token wrong)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.events import LoadRequest, SamplingParams
from engine.generate.session import Session
from tests.engine.generate import test_speculation_in_batch as lookups
from tests.engine.generate.test_batch_run import Run, alone, request
from tests.engine.generate.test_speculation_in_batch import COPY, lookup, verified_rounds
from tests.engine.helpers import finished, token_ids

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="follower processes are found through /proc (Linux)")
GREEDY = SamplingParams(temperature=0.0)
oracle = lookups.oracle  # the fixture: prompt lookup proposes the plain answer, some of it wrong


@pytest.fixture(scope="module")
def pair(tiny_model, one_thread):
    """(the unsplit model, the same model over 2 ranks): one 2-rank start for the module."""
    from engine.parallel.session import TPSession

    one = Session.load(LoadRequest(str(tiny_model), device="cpu", context=512))
    two = TPSession.load(LoadRequest(str(tiny_model), device="cpu", context=512,
                                     tensor_parallel=2, kv_tokens=1024))
    yield one, two
    two.close()


def test_a_split_batch_equals_the_unsplit_model_alone(pair):
    one, two = pair
    assert two.cache.num_blocks * two.cache.block_size == 1024  # every rank's arena: --kv-tokens
    assert not any("one at a time" in note for note in two.loaded_event().notes)
    reqs = [request(i, sampling=GREEDY) for i in range(8)]
    expected = alone(one, reqs)
    run = Run(two)
    try:
        for i, req in enumerate(reqs):
            run.submit(f"r{i}", req)
        got = [run.tokens(f"r{i}") for i in range(8)]
    finally:
        run.close()
    assert got == expected
    assert max(run.engine.batch.rows_seen) >= 5  # batched steps of many rows ran on both ranks
    prompts = sum(len(one.prompt_ids(r)) > 1 for r in reqs)  # a one-token prompt is a row
    assert sum(run.engine.batch.prefill_passes.values()) >= prompts  # and their prefills


def test_prompt_lookup_rows_beside_plain_rows_give_their_plain_tokens(pair, oracle):
    """Verify rows (the pending token and K proposals, every position's logits) go to both
    ranks inside the batch's steps, beside plain rows: each request's tokens are the unsplit
    model's alone, proposals accepted and rejected."""
    one, two = pair
    prompts = [COPY, "a b c d a b c d a b c d a b"]
    spec = [lookup(i, prompt=p, max_new_tokens=24) for i, p in enumerate(prompts)]
    plain = [request(i, max_new_tokens=20) for i in (1, 2, 3)]  # sampled, greedy, sampled
    expected = oracle(one, [(p, 24) for p in prompts]) + alone(one, plain)
    two.adaptive, two.switch_off = False, False  # a round every step, crowded or not
    run = Run(two)
    try:
        for i, r in enumerate(plain):
            run.submit(f"p{i}", r)
        run.wait("p0", first_token=True)
        for i, r in enumerate(spec):
            run.submit(f"s{i}", r)
        got = [run.tokens(f"s{i}") for i in range(2)] + [run.tokens(f"p{i}") for i in range(3)]
        assert verified_rounds(run) == 2
        assert max(run.engine.batch.spec.passes) >= 2  # two verify rows in one pass
        assert max(run.engine.batch.rows_seen) >= 2  # plain rows together beside them
    finally:
        run.close()
        two.adaptive, two.switch_off = True, True
    assert got == expected


def test_a_single_generation_is_a_batch_of_one(pair, oracle):
    """generate() on a split model runs a batch of one (the ranks run no other pass): a plain
    request and a speculating one give the unsplit model's tokens, a next turn over the cached
    prefix too; a batch of many after it, and one of one again, still agree (the followers'
    decoder for each batch is made again and given its tables whole)."""
    one, two = pair
    plain = request(0, prompt=COPY, max_new_tokens=24, sampling=GREEDY)
    looked = lookup(0, prompt=COPY, max_new_tokens=24)
    [expected] = oracle(one, [(COPY, 24)])
    assert token_ids(list(one.generate(plain))) == expected
    two.adaptive, two.switch_off = False, False
    try:
        assert token_ids(list(two.generate(plain))) == expected
        events = list(two.generate(looked))
        assert token_ids(events) == expected
        stats = finished(events).stats
        assert 0 < stats.accepted_draft_tokens < stats.proposed_draft_tokens
        assert token_ids(list(two.generate(plain))) == expected  # its cached prefix, reused
    finally:
        two.adaptive, two.switch_off = True, True
    assert 1 in two._batches  # the batched decoder of one row ran them
    reqs = [request(i, sampling=GREEDY, max_new_tokens=12) for i in range(3)]
    run = Run(two)
    try:
        for i, req in enumerate(reqs):
            run.submit(f"r{i}", req)
        assert [run.tokens(f"r{i}") for i in range(3)] == alone(one, reqs)
    finally:
        run.close()
    assert token_ids(list(two.generate(plain))) == expected
