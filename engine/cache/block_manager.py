"""Host-side bookkeeping of a paged KV arena: which fixed-size block holds which tokens of which
sequence, shared prefixes found by hash, reference counts, least-recently-used eviction.

Pure Python, no torch. kv_cache.KVCache drives it for its one live sequence: `append` before
every pass writes (KVCache.reserve: a prefill chunk, a decode step, a verify block), `commit`
before the live sequence changes (its full blocks become shareable), `crop` for a next turn,
regenerate or edit (the returned (src, dst) blocks are copied in the arena first), `release` and
`allocate` when a prompt's start is cached by another conversation (KVCache.reuse). The blocks
live in kv_arena.KVArena; the sequence's block ids are mirrored into a device int32 table that
the decode step reads (position p at table[p // block_size], slot p % block_size).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from engine.cache.sliding_pool import SlidingPool, recompute_start


class OutOfBlocks(RuntimeError):
    """The arena has too few free or evictable blocks for the request; nothing was changed."""


@dataclass
class Block:
    id: int
    ref_count: int = 0
    hash: int | None = None  # set once the block is full and committed: shareable from then on
    token_ids: tuple[int, ...] = ()  # what `hash` covers: checked on a hit, so collisions are safe


@dataclass
class Sequence:
    """One conversation's blocks: position p is in block_ids[p // block_size]."""

    block_ids: list[int] = field(default_factory=list)
    num_tokens: int = 0  # positions 0..num_tokens-1 have a block (written or about to be)
    hashes: list[int] = field(default_factory=list)  # of its committed full blocks, in order
    # the sliding layers' blocks (cache/sliding_pool.py): logical block i in ring[i % ring size]
    ring: list[int] = field(default_factory=list)
    ring_from: int = 0  # the sliding K/V below this position are overwritten or were never made
    keep: int = 0  # the global layers' K/V below this position are shared: never written again


def block_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    """A block's key: its own tokens and, through `parent`, every token before it."""
    return hash((parent, tokens))  # int tuples hash the same in every process (no salt)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16,
                 sliding: SlidingPool | None = None):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the arena needs at least one block of at least one token")
        self.block_size = block_size
        self.sliding = sliding  # the sliding layers' rings, counted with the blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids = list(range(num_blocks - 1, -1, -1))  # never hashed (or unhashed): a stack
        self.by_hash: dict[int, int] = {}  # hash -> block id, referenced or evictable
        self.evictable: OrderedDict[int, None] = OrderedDict()  # ref 0, hashed: oldest first

    # ------------------------------------------------------------------ queries

    @property
    def num_available(self) -> int:
        """Blocks a new allocation may take: free ones and evictable cached ones."""
        return len(self.free_ids) + len(self.evictable)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_prefix(self, token_ids: list[int]) -> list[int]:
        """Block ids holding the longest run of leading full blocks of `token_ids` (no change)."""
        found, parent, B = [], None, self.block_size
        for i in range(len(token_ids) // B):
            tokens = tuple(token_ids[i * B:(i + 1) * B])
            h = block_hash(parent, tokens)
            block_id = self.by_hash.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            found.append(block_id)
            parent = h
        return found

    # ------------------------------------------------------------------ changes

    def allocate(self, seq: Sequence, token_ids: list[int]) -> int:
        """Give an empty `seq` blocks for `token_ids`, sharing cached full blocks of its prefix.
        Returns how many leading tokens need no prefill (a multiple of block_size): with sliding
        layers, fewer than are shared (their sliding K/V are computed again from
        sliding_pool.recompute_start; the shared global K/V stay as they are: seq.keep)."""
        assert not seq.block_ids, "allocate starts a sequence; use append to grow one"
        shared = self.cached_prefix(token_ids)
        # the last token is always computed: its logits start the answer
        while shared and len(shared) * self.block_size >= len(token_ids):
            shared.pop()
        num_new = self.blocks_for(len(token_ids)) - len(shared)
        evictable_shared = sum(b in self.evictable for b in shared)
        if num_new > self.num_available - evictable_shared:
            raise OutOfBlocks(f"{num_new} blocks needed, {self.num_available} available")
        self._check_ring(seq, self.blocks_for(len(token_ids)))
        for block_id in shared:
            self._take(block_id)
            seq.hashes.append(self.blocks[block_id].hash)
        seq.block_ids = shared + [self._new_block() for _ in range(num_new)]
        seq.num_tokens = len(token_ids)
        start = len(shared) * self.block_size
        if self.sliding is None:
            return start
        p = self.sliding
        p.grow(seq, len(seq.block_ids))
        seq.keep, seq.ring_from = start, max(seq.ring_from, start)
        return recompute_start(start, p.window, p.num_sliding, self.block_size)

    def append(self, seq: Sequence, num_tokens: int) -> None:
        """Grow `seq` to hold `num_tokens` positions (a decode step, a verify block)."""
        needed = self.blocks_for(num_tokens) - len(seq.block_ids)
        if needed > self.num_available:
            raise OutOfBlocks(f"{needed} blocks needed, {self.num_available} available")
        self._check_ring(seq, self.blocks_for(num_tokens))
        seq.block_ids += [self._new_block() for _ in range(max(needed, 0))]
        seq.num_tokens = max(seq.num_tokens, num_tokens)
        if self.sliding is not None:
            self.sliding.grow(seq, len(seq.block_ids))

    def commit(self, seq: Sequence, token_ids: list[int]) -> None:
        """K/V of `token_ids` (positions 0..len-1 of seq) are written: key its full blocks so
        other sequences can share them. A block whose tokens are already cached elsewhere stays
        private (no copy, no move: the sequence's table does not change)."""
        B = self.block_size
        assert len(token_ids) <= seq.num_tokens, "commit what the sequence has blocks for"
        for i in range(len(seq.hashes), len(token_ids) // B):
            tokens = tuple(token_ids[i * B:(i + 1) * B])
            h = block_hash(seq.hashes[-1] if seq.hashes else None, tokens)
            seq.hashes.append(h)
            block = self.blocks[seq.block_ids[i]]
            if block.hash is None and h not in self.by_hash:
                block.hash, block.token_ids = h, tokens
                self.by_hash[h] = block.id

    def crop(self, seq: Sequence, length: int, keep_cached: bool = False
             ) -> list[tuple[int, int]]:
        """Keep positions 0..length-1 of `seq`. Returns (src, dst) block copies the caller makes
        before anything else allocates: a kept partial block that another sequence shares is
        never written in place, so this sequence gets a private copy of it. `keep_cached`: a
        kept partial block that is keyed (full, committed) is copied too where a block is
        available, so that it stays cached for the conversation it came from (the caller is
        switching conversations); otherwise it loses its key, as its tail will be rewritten."""
        B = self.block_size
        keep = self.blocks_for(length)
        if length % B and keep and self.blocks[seq.block_ids[keep - 1]].ref_count > 1:
            freed = sum(self.blocks[b].ref_count == 1 for b in seq.block_ids[keep:])
            if not self.num_available + freed:  # checked first: a failed crop changes nothing
                raise OutOfBlocks("no block left to copy a shared partial block into")
        # the deepest blocks first: they become the least recently used, so they are evicted
        # before the blocks their hash chain hangs from
        for block_id in reversed(seq.block_ids[keep:]):
            self._release(block_id)
        del seq.block_ids[keep:]
        del seq.hashes[length // B:]
        seq.num_tokens = min(seq.num_tokens, length)
        seq.keep = min(seq.keep, length // B * B)  # a pass from `length` writes every layer
        if self.sliding is not None:
            self.sliding.trim(seq, keep)
        if not length % B or not seq.block_ids:
            return []
        last = self.blocks[seq.block_ids[-1]]
        if last.ref_count == 1:
            if last.hash is None:
                return []
            if not (keep_cached and self.num_available):
                # its tail will be overwritten: no longer what it was keyed by
                del self.by_hash[last.hash]
                last.hash, last.token_ids = None, ()
                return []
        dst = self._new_block()  # before the release: src cannot be evicted under the copy
        self._release(last.id)
        seq.block_ids[-1] = dst
        return [(last.id, dst)]

    def release(self, seq: Sequence) -> None:
        """The sequence is gone: its blocks go back (keyed ones stay cached until evicted)."""
        self.crop(seq, 0)

    # ------------------------------------------------------------------ internals

    def _check_ring(self, seq: Sequence, num_blocks: int) -> None:
        if self.sliding is not None and self.sliding.need(seq, num_blocks) > len(
                self.sliding.free_ids):
            raise OutOfBlocks(f"{self.sliding.need(seq, num_blocks)} sliding-layer blocks "
                              f"needed, {len(self.sliding.free_ids)} available")

    def _take(self, block_id: int) -> None:
        self.evictable.pop(block_id, None)
        self.blocks[block_id].ref_count += 1

    def _new_block(self) -> int:
        if self.free_ids:
            block_id = self.free_ids.pop()
        else:  # the least recently used cached block: unreferenced, so no live sequence reads it
            block_id, _ = self.evictable.popitem(last=False)
            block = self.blocks[block_id]
            del self.by_hash[block.hash]
            block.hash, block.token_ids = None, ()
        self.blocks[block_id].ref_count = 1
        return block_id

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {block_id} released more often than taken"
        if block.ref_count:
            return
        if block.hash is None:
            self.free_ids.append(block_id)
        else:
            self.evictable[block_id] = None  # newest at the end: evicted last
