"""The scheduler against a fake model whose KV cache holds token ids: random arrivals, lengths,
cancellations and arena sizes. After every step no block is leaked or double-owned, a chunk writes
only blocks its sequence owns alone, every sampled position sees exactly its sequence's tokens
(shared prefixes, recomputed preemptions and speculative tokens, whose rejected positions are
overwritten later, included), every request ends exactly once, and each sequence generates what
it generates alone."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.batch.scheduler import Scheduler, TooLong
from engine.batch.sequence import Seq, State
from engine.cache.block_manager import BlockManager
from engine.events.stream import FINISH_REASONS

VOCAB = 50


class FakeModel:
    """K/V as the hash of the tokens up to each position (as real K/V depend on every token
    before them): kv[block][slot]. The next token is a function of what the sequence reads back
    through its block table, so a wrong table, a stale or wrongly shared block shows."""

    def __init__(self, blocks: BlockManager):
        self.blocks = blocks
        self.kv = {b.id: [None] * blocks.block_size for b in blocks.blocks}

    def run(self, step) -> tuple[dict[Seq, int], dict[Seq, list[int]]]:
        """-> (each sampled chunk's next token, each verify row's committed tokens)."""
        B = self.blocks.block_size
        sampled, verified = {}, {}
        for c in step.chunks:
            seq = c.seq
            assert c.length >= 1, "a chunk computes at least one token (the last one's logits)"
            fed = seq.token_ids[:c.start] + c.token_ids  # a verify row's proposals last
            for p in range(c.start, c.start + c.length):
                block = seq.table.block_ids[p // B]
                assert self.blocks.blocks[block].ref_count == 1, "wrote a shared block"
                self.kv[block][p % B] = hash(tuple(fed[:p + 1]))
            if c.sample:
                seen = [self.kv[seq.table.block_ids[p // B]][p % B] for p in range(seq.num_tokens)]
                ids = seq.token_ids
                want = [hash(tuple(ids[:p + 1])) for p in range(len(ids))]
                assert seen == want, f"{seq.id} reads other K/V than its own"
                if c.spec:  # greedy acceptance: proposals while they are the model's own
                    out = []
                    for proposal in c.spec:
                        if proposal != next_token(ids + out):
                            break
                        out.append(proposal)
                    verified[seq] = out + [next_token(ids + out)]
                else:
                    sampled[seq] = next_token(ids)
        return sampled, verified


def propose(sched: Scheduler, k: int, wrong: int) -> None:
    """Up to k proposals for every decoding sequence: its own continuation, every `wrong`-th
    position off (0: never)."""
    for seq in sched.running:
        n = min(k, seq.max_new_tokens - len(seq.output_ids) - 1)
        if seq.num_pending == 1 and n > 0:
            out = seq.output_ids[:]
            for _ in range(n):
                t = next_token(seq.prompt_ids + out)
                out.append((t + 1) % VOCAB if wrong and len(out) % wrong == 0 else t)
            seq.spec_ids = out[len(seq.output_ids):]


def next_token(tokens: list[int]) -> int:
    return hash(tuple(tokens)) % VOCAB


def alone(prompt: list[int], n: int) -> list[int]:
    out = []
    for _ in range(n):
        out.append(next_token(prompt + out))
    return out


def check_blocks(sched: Scheduler) -> None:
    bm = sched.blocks
    owners = Counter(b for s in sched.running for b in s.table.block_ids)
    for block in bm.blocks:
        assert block.ref_count == owners[block.id], f"block {block.id} ref count is off"
    free, evictable = set(bm.free_ids), set(bm.evictable)
    assert len(free) == len(bm.free_ids) and not free & evictable
    assert not free & set(owners) and not evictable & set(owners)
    assert len(free) + len(evictable) + len(owners) == len(bm.blocks), "a block leaked"
    for seq in sched.waiting:
        assert not seq.table.block_ids and seq.state is State.WAITING


requests = st.lists(st.tuples(st.integers(0, 12),  # arrival step
                              st.integers(1, 40),  # prompt length
                              st.integers(1, 12),  # new tokens
                              st.sampled_from([None, 0, 2, 5]),  # cancelled at this step
                              st.integers(0, 2)),  # prompt family: shared prefixes
                    min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(requests, st.integers(4, 40), st.sampled_from([2, 4, 8]), st.integers(1, 6),
       st.integers(1, 48), st.integers(0, 5), st.sampled_from([0, 2, 3]))
def test_random_traffic(reqs, num_blocks, block_size, max_seqs, budget, k, wrong):
    bm = BlockManager(num_blocks, block_size)
    sched, model = Scheduler(bm, max_seqs, budget), FakeModel(bm)
    seqs, ended, cancel_at = [], Counter(), {}
    for i, (_, length, new, cancel, family) in enumerate(reqs):
        own = [(i * 7 + j) % VOCAB for j in range(length - length // 2)]
        prompt = [family] * (length // 2) + own
        seqs.append(Seq(f"r{i}", prompt, new))
        if cancel is not None:
            cancel_at[i] = reqs[i][0] + cancel
    rejected = set()
    for t in range(2000):
        for i, (arrive, *_rest) in enumerate(reqs):
            if arrive == t:
                try:
                    sched.add(seqs[i])
                except TooLong:
                    rejected.add(i)
                    assert bm.blocks_for(seqs[i].max_tokens) > num_blocks
            if cancel_at.get(i) == t and seqs[i].state is not State.FINISHED and arrive <= t \
                    and i not in rejected:
                sched.finish(seqs[i], "cancelled")
        if t > max(r[0] for r in reqs) and not sched.has_work:
            break
        propose(sched, k, wrong)
        step = sched.schedule()
        assert step.num_tokens <= budget and len(sched.running) <= max_seqs
        sched.finish_step(step, *model.run(step))
        check_blocks(sched)
    else:
        pytest.fail("requests never finished")
    for i, seq in enumerate(seqs):
        if i in rejected:
            continue
        assert seq.state is State.FINISHED, seq
        ended[seq.id] += 1
        if seq.finish_reason == "max_tokens":
            assert seq.output_ids == alone(seq.prompt_ids, seq.max_new_tokens)
        else:
            assert seq.finish_reason == "cancelled"
            assert seq.output_ids == alone(seq.prompt_ids, len(seq.output_ids))
    assert sum(bm.blocks[b].ref_count for b in range(num_blocks)) == 0


def test_preemption_recomputes_the_same_tokens():
    bm = BlockManager(6, 4)  # 24 positions for two sequences that need 15 each
    sched, model = Scheduler(bm, max_seqs=2, token_budget=64), FakeModel(bm)
    a, b = Seq("a", list(range(8)), 8), Seq("b", list(range(10, 18)), 8)
    sched.add(a)
    sched.add(b)
    while sched.has_work:
        step = sched.schedule()
        sched.finish_step(step, *model.run(step))
        check_blocks(sched)
    assert sched.num_preemptions >= 1 and b.preemptions >= 1 and a.preemptions == 0
    assert a.output_ids == alone(a.prompt_ids, 8) and b.output_ids == alone(b.prompt_ids, 8)


def test_a_sequence_at_its_limit_ends_with_the_finished_events_reason():
    bm = BlockManager(8, 4)
    sched, model = Scheduler(bm, max_seqs=2, token_budget=64), FakeModel(bm)
    seq = Seq("a", list(range(5)), 3)
    sched.add(seq)
    while sched.has_work:
        step = sched.schedule()
        sched.finish_step(step, *model.run(step))
    # one vocabulary: the scheduler's reason is the one the loop's Finished event carries
    assert seq.finish_reason == "max_tokens" and seq.finish_reason in FINISH_REASONS


def test_a_shared_prompt_start_is_not_computed_twice():
    bm = BlockManager(16, 4)
    sched, model = Scheduler(bm, max_seqs=4, token_budget=64), FakeModel(bm)
    system = list(range(12))
    first = Seq("first", system + [40], 2)
    sched.add(first)
    while sched.has_work:
        step = sched.schedule()
        sched.finish_step(step, *model.run(step))
    second = Seq("second", system + [41, 42], 2)
    sched.add(second)
    step = sched.schedule()
    assert [(c.seq.id, c.start) for c in step.chunks] == [("second", 12)]


def test_a_request_larger_than_the_cache_is_refused():
    sched = Scheduler(BlockManager(4, 4), max_seqs=2, token_budget=8)
    with pytest.raises(TooLong):
        sched.add(Seq("big", list(range(10)), 8))


def test_a_prompt_cached_whole_still_computes_its_last_token():
    bm = BlockManager(16, 4)
    sched, model = Scheduler(bm, max_seqs=4, token_budget=64), FakeModel(bm)
    prompt = list(range(8))  # two full blocks, both cached after the first request
    for name in ("first", "again"):
        seq = Seq(name, list(prompt), 2)
        sched.add(seq)
        step = sched.schedule()
        assert [(c.seq.id, c.start, c.length) for c in step.chunks] == [
            (name, 0 if name == "first" else 4, 8 if name == "first" else 4)]
        while sched.has_work:
            sched.finish_step(step, *model.run(step))
            step = sched.schedule()
        assert seq.output_ids == alone(prompt, 2)


def test_token_at_is_token_ids_at_every_position():
    seq = Seq("a", [5, 6, 7], 4, output_ids=[8, 9])
    assert [seq.token_at(i) for i in range(seq.num_tokens)] == seq.token_ids
