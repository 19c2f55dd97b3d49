"""A split model batches (CPU, gloo, 2 ranks): requests running together through the service
Engine give, token for token, what the unsplit model gives each alone (fp32 greedy), in batched
steps and prefill passes that every rank runs over its shard, in arenas of --kv-tokens; a
request that speculates alone after the batch (rank 0's blocks bound on every rank) still gives
its plain answer, and so does its next turn over its cached prefix."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.events import LoadRequest, SamplingParams
from engine.generate.session import Session
from tests.engine.generate.test_batch_run import Run, alone, request
from tests.engine.helpers import greedy_request, token_ids

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="follower processes are found through /proc (Linux)")
GREEDY = SamplingParams(temperature=0.0)


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


def test_speculating_alone_after_a_batch_gives_the_plain_answer(pair):
    """The batch wrote the followers' arenas at rank 0's blocks; a request alone afterwards
    binds rank 0's blocks on every rank, so no follower reads or writes another's."""
    one, two = pair
    run = Run(two)
    try:
        for i in range(3):
            run.submit(f"r{i}", request(i, sampling=GREEDY))
        [run.tokens(f"r{i}") for i in range(3)]
    finally:
        run.close()
    copy = "copy: a b c d e a b c d e a b"
    looked = list(two.generate(greedy_request(copy, n=24, prompt_lookup=True)))
    assert token_ids(looked) == token_ids(list(one.generate(greedy_request(copy, n=24))))
    again = list(two.generate(greedy_request(copy, n=24)))  # its cached prefix, reused
    assert token_ids(again) == token_ids(looked)
