"""Which tokens of which sequences one step computes, under a token budget (vLLM V1's policy):
running sequences first (a decode is one token, and its proposals where it speculates, as far as
the budget holds them; a prefill continues in chunks), then waiting ones
in arrival order while the budget, `max_seqs` and free blocks allow. Admission shares the cached
blocks of a prompt's prefix (block_manager's hashes, across concurrent sequences). When a running
sequence needs a block and none is left, the newest running sequence is preempted (its blocks go
back; its full blocks stay cached by hash) and recomputed later: never an out-of-memory. Where
sliding layers keep rings of their own (cache/sliding_pool.py), a sequence's ring blocks count as
its blocks do: one that cannot get them waits, or preempts, alike.

Pure Python: the step (which runs the chunks) and the sampler report back through `finish_step`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.batch.sequence import Chunk, Seq, State
from engine.cache.block_manager import BlockManager, OutOfBlocks


class TooLong(ValueError):
    """A request that could never fit the arena alone (prompt and max tokens past its blocks)."""


@dataclass(frozen=True)
class Step:
    chunks: tuple[Chunk, ...]
    preempted: tuple[Seq, ...]  # sent back to waiting by this step's planning

    @property
    def num_tokens(self) -> int:
        return sum(c.length for c in self.chunks)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_seqs: int, token_budget: int):
        if max_seqs < 1 or token_budget < 1:
            raise ValueError("max_seqs and the token budget must be at least 1")
        self.blocks = blocks
        self.max_seqs = max_seqs
        self.token_budget = token_budget
        # a chunk no longer than the sliding layers' rings cover (cache/sliding_pool.py)
        self.max_chunk = blocks.sliding.chunk if blocks.sliding is not None else token_budget
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []  # in admission order: the last is the newest
        self._arrivals = 0
        self.num_preemptions = 0

    # ------------------------------------------------------------------ requests

    def add(self, seq: Seq) -> None:
        need = self.blocks.blocks_for(max(seq.max_tokens, 1))
        if need > len(self.blocks.blocks):
            raise TooLong(f"the prompt and {seq.max_new_tokens} new tokens need {need} KV "
                          f"blocks; the cache has {len(self.blocks.blocks)}")
        seq.state = State.WAITING
        self.waiting.append(seq)

    def finish(self, seq: Seq, reason: str) -> None:
        """End `seq` wherever it is, for `reason` (a Finished event's: events/stream.py); its
        blocks go back."""
        if seq.state is State.FINISHED:
            return
        if seq.state is State.RUNNING:
            self.blocks.commit(seq.table, seq.token_ids[:seq.num_computed])
            self.blocks.release(seq.table)
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        seq.state, seq.finish_reason = State.FINISHED, reason

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ one step

    def schedule(self) -> Step:
        budget, chunks, preempted = self.token_budget, [], []
        for seq in list(self.running):  # oldest first
            if seq.state is not State.RUNNING or not budget:
                continue
            spec, seq.spec_ids = seq.spec_ids, []
            n = min(seq.num_pending + len(spec), budget, self.max_chunk)
            spec = tuple(spec[:max(0, n - seq.num_pending)])
            if not self._grow(seq, seq.num_computed + n, preempted):
                continue  # seq itself was preempted: nothing older was left to take from
            chunks.append(Chunk(seq, seq.num_computed, n, spec))
            budget -= n
        while budget and self.waiting and len(self.running) < self.max_seqs and not preempted:
            seq = self.waiting[0]
            try:
                start = self.blocks.allocate(seq.table, seq.token_ids)
            except OutOfBlocks:
                break  # first come, first served: later arrivals do not jump the queue
            self.waiting.popleft()
            seq.spec_ids = []
            self._arrivals += 1
            seq.arrival, seq.num_computed, seq.state = self._arrivals, start, State.RUNNING
            self.running.append(seq)
            n = min(seq.num_pending, budget, self.max_chunk)
            chunks.append(Chunk(seq, start, n))
            budget -= n
        return Step(tuple(chunks), tuple(preempted))

    def _grow(self, seq: Seq, num_tokens: int, preempted: list[Seq]) -> bool:
        """Blocks for positions below num_tokens, preempting the newest running sequences as
        needed; False when `seq` is the newest and had to go itself."""
        while True:
            try:
                self.blocks.append(seq.table, num_tokens)
                return True
            except OutOfBlocks:
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    return False

    def _preempt(self, seq: Seq) -> None:
        """Back to the front of the queue, to be recomputed: its committed full blocks stay
        cached by hash, so what survives eviction is not computed again."""
        self.blocks.commit(seq.table, seq.token_ids[:seq.num_computed])
        self.blocks.release(seq.table)
        self.running.remove(seq)
        seq.num_computed, seq.state = 0, State.WAITING
        seq.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish_step(self, step: Step, sampled: dict[Seq, int],
                    verified: dict[Seq, list[int]] | None = None) -> None:
        """The step ran: every chunk's K/V is written; `sampled` holds the next token of each
        chunk that ended at its sequence's last token; `verified` each verify row's committed
        tokens (its accepted proposals, whose K/V stay, then the target's own). A sequence that
        reached max_new_tokens is finished ("max_tokens"); the caller finishes the others (eos, stop
        strings) with `finish`."""
        verified = verified or {}
        for chunk in step.chunks:
            seq = chunk.seq
            if seq.state is not State.RUNNING:
                continue  # finished (cancelled) while the step ran
            seq.num_computed = chunk.start + chunk.length - len(chunk.spec)
            if seq in verified:
                tokens = verified[seq][:seq.max_new_tokens - len(seq.output_ids)]
                seq.num_computed += len(tokens) - 1  # the accepted proposals' K/V are right
                seq.output_ids.extend(tokens)
            elif chunk.sample and seq in sampled:
                seq.output_ids.append(sampled[seq])
            if seq.num_computed // self.blocks.block_size > len(seq.table.hashes):
                self.blocks.commit(seq.table, seq.token_ids[:seq.num_computed])  # a block filled
            if seq.done:
                self.finish(seq, "max_tokens")
