"""The blocks of the sliding-window layers (Gemma 2 and 3's local layers), beside the global
layers' (cache/block_manager.py): a pool of their own, of which each sequence holds a ring of at
most `ring` blocks. Logical block i of a sequence lives in ring[i % ring], so the sliding layers'
block table (entry i = ring[i % ring]) serves every read and write path as the global table
does: positions older than the window share a block with newer ones and are masked out
(attention/sliding_window.py), and a long context costs mostly the global layers.

The ring covers the window plus the longest pass written before its attention reads it (a
prefill chunk, a verify block), at any block alignment: the keys a query of the pass sees are
never overwritten by a later token of the same pass.

Pure Python, no torch: the planner counts the same arithmetic (plan/sizes.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.plan.sizes import ring_blocks  # noqa: F401 (the planner's arithmetic, re-exported)

if TYPE_CHECKING:
    from engine.cache.block_manager import Sequence


def recompute_start(keep: int, window: int, num_sliding: int, block_size: int) -> int:
    """Where a sequence whose first `keep` tokens have global K/V but no sliding K/V starts its
    prefill: a sliding layer's K/V at p depend on the window below p of every sliding layer under
    it, so the sliding K/V of the window before `keep` are right only when computed from
    num_sliding windows before it (block aligned). The global layers keep their K/V below
    `keep` (Sequence.keep): they are not written again."""
    return max(0, (keep - num_sliding * (window - 1)) // block_size * block_size)


class SlidingPool:
    """Free blocks of the sliding layers' arena; a sequence's ring grows with its blocks up to
    `ring` of them (a short sequence holds fewer)."""

    def __init__(self, num_blocks: int, ring: int, window: int, num_sliding: int,
                 block_size: int, chunk: int):
        self.num_blocks, self.ring, self.window = num_blocks, ring, window
        self.num_sliding, self.block_size, self.chunk = num_sliding, block_size, chunk
        self.free_ids = list(range(num_blocks - 1, -1, -1))

    def renewed(self) -> SlidingPool:
        """The same pool with every block free."""
        return SlidingPool(self.num_blocks, self.ring, self.window, self.num_sliding,
                           self.block_size, self.chunk)

    def need(self, seq: Sequence, num_blocks: int) -> int:
        """Blocks `seq` takes from the pool to hold `num_blocks` logical blocks."""
        return max(0, min(num_blocks, self.ring) - len(seq.ring))

    def grow(self, seq: Sequence, num_blocks: int) -> None:
        """Ring blocks for logical blocks below num_blocks (need() checked first). A logical
        block past the ring overwrites the one `ring` before it: the sliding K/V below that are
        gone (seq.ring_from)."""
        for _ in range(self.need(seq, num_blocks)):
            seq.ring.append(self.free_ids.pop())
        seq.ring_from = max(seq.ring_from, (num_blocks - self.ring) * self.block_size)

    def trim(self, seq: Sequence, num_blocks: int) -> None:
        """Keep the ring entries of logical blocks below num_blocks (0: give the ring back)."""
        while len(seq.ring) > max(num_blocks, 0):
            self.free_ids.append(seq.ring.pop())
        if not num_blocks:
            seq.ring_from = 0

    def entries(self, seq: Sequence, num_blocks: int) -> list[int]:
        """The sliding layers' block table of `seq` for its logical blocks below num_blocks."""
        return [seq.ring[i % self.ring] for i in range(num_blocks)]

    def intact(self, seq: Sequence, start: int) -> bool:
        """Whether the sliding K/V a pass from `start` reads (the window before it) are in the
        ring."""
        return start == 0 or max(0, start - self.window + 1) >= seq.ring_from
