"""The scheduler over an arena whose sliding layers keep rings (cache/sliding_pool.py), against a
fake model whose K/V hold token ids: random arrivals, lengths, shared prefixes, windows, passes
and pool sizes. Each chunk writes every position, then each of its queries reads its window back
through the ring table (a layer writes a pass's K/V before its attention reads them): what it
reads is its own sequence's, and the global table reads every position right; no ring block is
leaked or owned twice; a request that cannot get ring blocks waits or preempts, and every request
ends with what it generates alone."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.batch.scheduler import Scheduler, TooLong
from engine.batch.sequence import Seq, State
from engine.cache.block_manager import BlockManager, OutOfBlocks, Sequence
from engine.cache.sliding_pool import SlidingPool, recompute_start, ring_blocks
from tests.engine.batch.test_scheduler import VOCAB, alone, next_token


class FakeRings:
    def __init__(self, bm: BlockManager):
        self.bm, B = bm, bm.block_size
        self.kv = {b.id: [None] * B for b in bm.blocks}
        self.ring = {i: [None] * B for i in range(bm.sliding.num_blocks)}

    def run(self, step) -> dict[Seq, int]:
        B, pool = self.bm.block_size, self.bm.sliding
        sampled = {}
        for c in step.chunks:
            seq, t = c.seq, c.seq.table
            ids = seq.token_ids
            value = lambda p: hash(tuple(ids[:p + 1]))  # noqa: B023, E731
            for p in range(c.start, c.start + c.length):
                self.ring[t.ring[(p // B) % pool.ring]][p % B] = value(p)
                if p >= t.keep:  # the global layers skip the shared blocks below keep
                    block = t.block_ids[p // B]
                    assert self.bm.blocks[block].ref_count == 1, "wrote a shared block"
                    self.kv[block][p % B] = value(p)
            for q in range(max(c.start, t.keep), c.start + c.length):  # the window of each
                for p in range(max(0, q - pool.window + 1), q + 1):
                    got = self.ring[t.ring[(p // B) % pool.ring]][p % B]
                    assert got == value(p), f"{seq.id}: key {p} of query {q} overwritten"
            if c.sample:
                seen = [self.kv[t.block_ids[p // B]][p % B] for p in range(seq.num_tokens)]
                assert seen == [value(p) for p in range(len(ids))]
                sampled[seq] = next_token(ids)
        return sampled


def check_rings(sched: Scheduler) -> None:
    pool = sched.blocks.sliding
    owned = [b for s in sched.running for b in s.table.ring]
    assert len(set(owned)) == len(owned), "a ring block owned twice"
    assert not set(owned) & set(pool.free_ids)
    assert len(owned) + len(pool.free_ids) == pool.num_blocks, "a ring block leaked"
    for s in sched.running:
        assert len(s.table.ring) == min(pool.ring, len(s.table.block_ids))
    for s in sched.waiting:
        assert not s.table.ring


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10), st.integers(1, 60), st.integers(1, 12),
                          st.integers(0, 2)), min_size=1, max_size=10),
       st.integers(8, 60), st.sampled_from([2, 4, 8]), st.integers(1, 6), st.integers(1, 24),
       st.integers(2, 20), st.integers(1, 3))
def test_random_traffic_over_rings(reqs, num_blocks, B, max_seqs, chunk, window, rings):
    ring = ring_blocks(window, chunk, B)
    bm = BlockManager(num_blocks, B, SlidingPool(rings * ring, ring, window, 2, B, chunk))
    sched = Scheduler(bm, max_seqs, token_budget=2 * chunk)  # its chunks capped at the ring's
    model, seqs, rejected = FakeRings(bm), [], set()
    for i, (_, length, new, family) in enumerate(reqs):
        prompt = [family] * (length // 2) + [(i * 7 + j) % VOCAB for j in range(length // 2 + 1)]
        seqs.append(Seq(f"r{i}", prompt, new))
    for t in range(3000):
        for i, (arrive, *_rest) in enumerate(reqs):
            if arrive == t:
                try:
                    sched.add(seqs[i])
                except TooLong:
                    rejected.add(i)
        if t > max(r[0] for r in reqs) and not sched.has_work:
            break
        step = sched.schedule()
        assert all(c.length <= chunk for c in step.chunks)
        sched.finish_step(step, model.run(step))
        check_rings(sched)
    else:
        pytest.fail("requests never finished")
    for i, seq in enumerate(seqs):
        if i not in rejected:
            assert seq.state is State.FINISHED and seq.output_ids == alone(
                seq.prompt_ids, seq.max_new_tokens)


def test_a_shared_prefix_is_computed_again_for_the_sliding_layers_not_written_again():
    B, window = 4, 5
    bm = BlockManager(16, B, SlidingPool(8, 4, window, 2, B, 8))
    first, second = Sequence(), Sequence()
    ids = list(range(30))
    assert bm.allocate(first, ids) == 0
    bm.commit(first, ids)
    start = bm.allocate(second, ids)  # 7 blocks shared (the last token is computed)
    assert second.keep == 28 and start == recompute_start(28, window, 2, B) == 20
    assert bm.blocks_for(30) == 8 and second.block_ids[:7] == first.block_ids[:7]
    assert len(second.ring) == 4 and not set(second.ring) & set(first.ring)
    third = Sequence()
    with pytest.raises(OutOfBlocks, match="sliding-layer"):  # both rings taken: it waits
        bm.allocate(third, [99] * 6)
    assert not third.block_ids and not third.ring  # nothing changed
    bm.release(second)
    assert second.keep == 0 and not second.ring and len(bm.sliding.free_ids) == 4
    assert bm.allocate(third, [99] * 6) == 0 and len(third.ring) == 2  # its two blocks' worth
