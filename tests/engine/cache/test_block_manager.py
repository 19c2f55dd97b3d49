"""block_manager.py over a simulated arena (a list of token slots per block, standing in for
K/V): shared system prompts, LRU eviction, crops, and no live sequence ever reading another's
tokens, whatever the order of operations under a small arena."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cache.block_manager import BlockManager, OutOfBlocks, Sequence

B = 4


class Arena:
    """The manager plus storage: what a session would do around it, token ids as 'K/V'."""

    def __init__(self, num_blocks: int, block_size: int = B):
        self.mgr = BlockManager(num_blocks, block_size)
        self.slots = [[None] * block_size for _ in range(num_blocks)]
        self.live: dict[str, tuple[Sequence, list[int]]] = {}

    def _write(self, seq: Sequence, start: int, ids: list[int]) -> None:
        size = self.mgr.block_size
        for p in range(start, len(ids)):
            self.slots[seq.block_ids[p // size]][p % size] = ids[p]

    def read(self, name: str) -> list[int]:
        seq, ids = self.live[name]
        size = self.mgr.block_size
        return [self.slots[seq.block_ids[p // size]][p % size] for p in range(len(ids))]

    def start(self, name: str, ids: list[int]) -> int:
        seq = Sequence()
        cached = self.mgr.allocate(seq, ids)
        self._write(seq, cached, ids)  # the prefill of what is not cached
        self.mgr.commit(seq, ids)
        self.live[name] = (seq, list(ids))
        return cached

    def grow(self, name: str, new: list[int]) -> None:
        seq, ids = self.live[name]
        self.mgr.append(seq, len(ids) + len(new))
        ids += new
        self._write(seq, len(ids) - len(new), ids)
        self.mgr.commit(seq, ids)

    def crop(self, name: str, length: int, keep_cached: bool = False) -> None:
        seq, ids = self.live[name]
        for src, dst in self.mgr.crop(seq, length, keep_cached):
            self.slots[dst] = list(self.slots[src])
        del ids[length:]

    def release(self, name: str) -> None:
        self.mgr.release(self.live.pop(name)[0])

    def check(self) -> None:
        """Every live sequence reads its own tokens; the counts and pools add up."""
        mgr = self.mgr
        held: dict[int, int] = {}
        for name, (seq, ids) in self.live.items():
            assert self.read(name) == ids, name
            assert len(seq.block_ids) == mgr.blocks_for(len(ids))
            for b in seq.block_ids:
                held[b] = held.get(b, 0) + 1
        assert {b.id: b.ref_count for b in mgr.blocks if b.ref_count} == held
        free, evictable = set(mgr.free_ids), set(mgr.evictable)
        assert len(free) == len(mgr.free_ids)
        assert not free & evictable and not free & set(held) and not evictable & set(held)
        assert len(free | evictable | set(held)) == len(mgr.blocks)
        for h, block_id in mgr.by_hash.items():
            block = mgr.blocks[block_id]
            assert block.hash == h and list(block.token_ids) == self.slots[block_id]

    def snapshot(self):
        mgr = self.mgr
        return (list(mgr.free_ids), list(mgr.evictable), dict(mgr.by_hash),
                [(b.ref_count, b.hash) for b in mgr.blocks],
                {n: (list(s.block_ids), s.num_tokens) for n, (s, _) in self.live.items()})


SYSTEM = list(range(100, 113))  # 13 tokens: three full blocks of 4 and one more


def test_a_new_chat_with_a_seen_system_prompt_shares_its_full_blocks():
    arena = Arena(16)
    assert arena.start("a", SYSTEM + [1, 2, 3]) == 0
    before = [list(s) for s in arena.slots]
    assert arena.start("b", SYSTEM + [7, 8]) == 12  # three full blocks; 13th token on
    seq_a, seq_b = arena.live["a"][0], arena.live["b"][0]
    assert seq_b.block_ids[:3] == seq_a.block_ids[:3]
    assert seq_b.block_ids[3:] != seq_a.block_ids[3:]
    assert [arena.mgr.blocks[b].ref_count for b in seq_a.block_ids[:3]] == [2, 2, 2]
    for b in seq_a.block_ids[:3]:  # shared without a copy: nothing was written to them
        assert arena.slots[b] == before[b]
    arena.check()


def test_the_last_prompt_token_is_always_computed():
    arena = Arena(8)
    arena.start("a", SYSTEM[:8] + [1])
    arena.release("a")
    assert arena.start("b", SYSTEM[:8]) == 4  # not 8: the last token's logits start the answer
    arena.check()


def test_released_prefixes_stay_cached_and_the_least_recent_goes_first():
    arena = Arena(6)
    arena.start("old", [1] * 8 + [2])  # 3 blocks, 2 of them keyed
    arena.release("old")
    arena.start("new", [3] * 8 + [4])
    arena.release("new")
    assert arena.mgr.num_available == 6
    arena.start("big", [5] * 13)  # 4 blocks: 2 free, then 2 evicted, the old chat's first
    arena.check()
    seq = arena.live["big"][0]
    assert len(seq.block_ids) == 4
    assert arena.mgr.cached_prefix([3] * 8 + [4]) != []  # the newer prefix survived
    assert arena.mgr.cached_prefix([1] * 8 + [2]) == []


def test_out_of_blocks_changes_nothing():
    arena = Arena(4)
    arena.start("a", list(range(10)))
    before = arena.snapshot()
    with pytest.raises(OutOfBlocks):
        arena.start("b", list(range(50, 60)))
    with pytest.raises(OutOfBlocks):
        arena.mgr.append(arena.live["a"][0], 17)
    assert arena.snapshot() == before
    arena.check()


def test_cropping_into_a_shared_block_copies_it():
    arena = Arena(16)
    arena.start("a", SYSTEM + [1])
    arena.start("b", SYSTEM + [2])
    arena.crop("b", 10)  # into the shared third block: b gets its own copy
    seq_a, seq_b = arena.live["a"][0], arena.live["b"][0]
    assert seq_b.block_ids[2] != seq_a.block_ids[2]
    arena.grow("b", [9, 9, 9, 9])  # rewrites positions 10.. in b's copy only
    arena.check()
    assert arena.read("a") == SYSTEM + [1]


def test_cropping_into_a_keyed_block_keeps_it_cached_when_asked():
    """A sequence that leaves its own committed full block part way (an edit, a switch to
    another conversation) gets a copy with keep_cached, so the block stays cached for the
    conversation it came from; without it the block loses its key and is rewritten in place."""
    for keep_cached in (False, True):
        arena = Arena(16)
        arena.start("a", SYSTEM + [1, 2, 3])  # 16 tokens: four full keyed blocks
        seq = arena.live["a"][0]
        third = seq.block_ids[2]
        arena.crop("a", 10, keep_cached)
        arena.grow("a", [7, 7, 7, 7, 7, 7])  # another conversation from position 10 on
        arena.check()
        assert (seq.block_ids[2] != third) == keep_cached
        arena.release("a")
        cached = len(arena.mgr.cached_prefix(SYSTEM + [1, 2, 3]))
        assert cached == (4 if keep_cached else 2)  # the old chain, or up to the rewritten block
    arena = Arena(4)  # every block held: no copy possible, the key goes instead
    arena.start("a", SYSTEM + [1, 2, 3])
    assert arena.mgr.crop(arena.live["a"][0], 14, keep_cached=True) == []
    assert arena.mgr.blocks[arena.live["a"][0].block_ids[3]].hash is None


def test_waste_over_a_long_chat_stays_under_five_percent():
    """Assigned minus used KV over assigned, for one chat growing turn by turn to 4K tokens
    with blocks of 16 (a static cache would assign the whole context from the start)."""
    rng = random.Random(0)
    arena = Arena(512, block_size=16)
    ids = [rng.randrange(1000) for _ in range(40)]
    arena.start("chat", ids)
    wastes = []
    while len(arena.live["chat"][1]) < 4000:
        arena.grow("chat", [rng.randrange(1000) for _ in range(rng.randrange(20, 300))])
        seq, ids = arena.live["chat"]
        assigned = len(seq.block_ids) * 16
        wastes.append((assigned - len(ids)) / assigned)
    arena.check()
    assert max(wastes[3:]) < 0.05  # under a block's worth from the first few hundred tokens


OPS = st.one_of(
    st.tuples(st.just("start"), st.sampled_from("abc"), st.integers(0, 2), st.integers(1, 9)),
    st.tuples(st.just("grow"), st.sampled_from("abc"), st.integers(1, 6)),
    st.tuples(st.just("crop"), st.sampled_from("abc"), st.integers(0, 30), st.booleans()),
    st.tuples(st.just("release"), st.sampled_from("abc")),
)
PROMPTS = (SYSTEM, SYSTEM[:6], list(range(200, 209)))


@settings(deadline=None, max_examples=200)
@given(ops=st.lists(OPS, max_size=40), num_blocks=st.integers(4, 12))
def test_eviction_under_a_small_arena_never_corrupts_a_live_sequence(ops, num_blocks):
    arena = Arena(num_blocks)
    fresh = iter(range(1000, 10**6))
    for op, name, *args in ops:
        before = arena.snapshot()
        try:
            if op == "start" and name not in arena.live:
                arena.start(name, PROMPTS[args[0]] + [next(fresh) for _ in range(args[1])])
            elif op == "grow" and name in arena.live:
                arena.grow(name, [next(fresh) for _ in range(args[0])])
            elif op == "crop" and name in arena.live:
                arena.crop(name, min(args[0], len(arena.live[name][1])), keep_cached=args[1])
            elif op == "release" and name in arena.live:
                arena.release(name)
        except OutOfBlocks:
            assert arena.snapshot() == before
        arena.check()
