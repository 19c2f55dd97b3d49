"""A continuous batch over every rank of tensor parallelism, the only way a split model
generates (a single generation is a batch of one). Rank 0's batched decoder (RankBatch) sends
each pass of generate/batch_run.py to the followers before it runs the pass itself, and each
follower runs the same pass (step/batched.py's BatchedDecoder: its batched step, its prefill of a
step's chunks, speculative verify rows among them) over its shard. The block tables are rank
0's scheduler's: every rank's arena has the same layout, so a block id names the same slot on
every rank, and a follower binds the blocks it is sent (`foreign`) instead of choosing its own.

A pass is the lockstep's header (parallel/follower.py: [op, a, n, 0, max_rows, epoch]), then
its tensors: a step's staged inputs (its tokens already resolved on rank 0's device, positions,
buckets, split counts) and its rows' block tables; a prefill's chunks, flattened (a verify row is
a chunk whose every position's logits are kept). `epoch` names rank 0's batched decoder: a
follower makes a new one of its own with it (its captured graphs start again where rank 0's
do), and a batched decoder that runs again after another's sends its tables whole.
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from engine.cache.block_manager import Sequence
from engine.models.prefill_batch import PassRow
from engine.step.batched import BatchedDecoder
from engine.step.decode import Decoder

OP_BATCH_PREFILL, OP_BATCH_STEP = 6, 7
_epochs = itertools.count(1)


def flatten(chunks: list[PassRow]) -> list[int]:
    """Chunks as one list of ints: per chunk its start, length, block count and whether it is
    a verify row, its tokens, its blocks."""
    out: list[int] = []
    for c in chunks:
        out += [c.start, len(c.token_ids), len(c.block_ids), int(c.every), *c.token_ids,
                *c.block_ids]
    return out


def unflatten(flat: list[int]) -> list[PassRow]:
    chunks, i = [], 0
    while i < len(flat):
        start, T, B, every = flat[i:i + 4]
        i += 4
        chunks.append(PassRow(flat[i:i + T], start, flat[i + T:i + T + B], bool(every)))
        i += T + B
    return chunks


def foreign(block_ids: list[int], block_size: int) -> Sequence:
    """A sequence over blocks rank 0 reserved: a follower's cache binds it and never allocates
    (its positions are covered up to the last block's end)."""
    return Sequence(list(block_ids), len(block_ids) * block_size)


class RankBatch(BatchedDecoder):
    """Rank 0's batched decoder: every pass goes to the followers first, then runs here over
    rank 0's shard; a rank that fails surfaces as the leader's TPFailed."""

    solo = False  # a step or a verify row of one goes to every rank as a batched pass too

    def __init__(self, leader, decoder: Decoder, max_rows: int):
        super().__init__(decoder, max_rows)  # rank 0's
        self.leader = leader
        self.epoch = next(_epochs)
        self._sent, self._rows_sent = -1, 0  # tables.writes and rows when the tables last went

    def prefill(self, chunks: list[PassRow], tables: list[Sequence],
                together: bool | None = None) -> tuple[list[torch.Tensor], bool]:
        def run():
            one_pass = self.together(chunks) if together is None else together
            flat = torch.tensor(flatten(chunks), dtype=torch.long, device=self.decoder.device)
            self._current()
            self.leader.send(OP_BATCH_PREFILL, int(one_pass), flat.numel(), 0, self.max_rows,
                             self.epoch)
            dist.broadcast(flat, src=0)
            return BatchedDecoder.prefill(self, chunks, tables, one_pass)
        return self.leader.run(run)

    def step(self, tokens: list[int], positions: list[int],
             tables: list[tuple[object, list[int]]],
             on_device: tuple[torch.Tensor, list[int]] | None = None) -> torch.Tensor:
        def run():
            n, lens = self.stage(tokens, positions, tables, on_device)
            rows = self.tables.table[:n]
            self._current()
            changed = self.tables.writes != self._sent or n > self._rows_sent
            self.leader.send(OP_BATCH_STEP, n, max(lens), int(changed), self.max_rows,
                             self.epoch)
            dist.broadcast(self.inputs, src=0)
            if changed:  # a row's blocks grow every block_size steps: most steps send none
                dist.broadcast(rows, src=0)
                self._sent, self._rows_sent = self.tables.writes, n
            return self.launch(n, max(lens), lens)[:len(tokens)]
        return self.leader.run(run)

    def _current(self) -> None:
        """Where another batched decoder ran since this one last did, the followers make a new
        one for this epoch: its block tables go whole with the next step."""
        if self.leader.epoch != self.epoch:
            self._sent, self._rows_sent = -1, 0


def follow(rank, op: int, a: int, n: int, flag: int, max_rows: int, epoch: int) -> None:
    """A follower's side of one batch pass (`rank`: its follower.Rank): receive, then run
    (`flag`: a step's block tables follow; they stay from step to step otherwise)."""
    batch = rank.batched(max_rows, epoch)
    device = rank.device
    if op == OP_BATCH_PREFILL:
        flat = torch.empty(n, dtype=torch.long, device=device)
        dist.broadcast(flat, src=0)
        chunks = unflatten(flat.tolist())
        size = rank.cache.block_size
        batch.prefill(chunks, [foreign(c.block_ids, size) for c in chunks], bool(a))
        return
    dist.broadcast(batch.inputs, src=0)
    if flag:
        table = torch.empty(a, batch.tables.max_blocks, dtype=torch.int32, device=device)
        dist.broadcast(table, src=0)
        batch.tables.table[:a].copy_(table)
    rank.batch_step(batch, a, n)
