"""The passes of a continuous batch over one decoder: the decode step of N sequences at once
(FamilyStep.batch over rows of block tables, eager or as CUDA graphs captured per (rows, KV
bucket) on first use, a step padded to the next of GRAPH_SIZES rows) and a step's prefill chunks
(in one pass, models/prefill_batch.py, or a pass each through the decoder). One sequence alone
keeps the Decoder's own step (its graphs, its speed): `step` runs for two rows or more where
`solo`; so does every row over transformers' own modules (no family step), one at a time. A
tensor-parallel rank 0 runs the same passes on every rank (parallel/batch_ops.py).

Each row reads its own bucket and split count, so its attention is what its step alone computes;
the linear layers take the rows together (their bits can change with the row count, except in the
reproducible mode, whose products run in calibrated tiles of rows).
"""

from __future__ import annotations

import time

import torch

from engine.attention import paged
from engine.attention.decode_attention import BatchRows
from engine.cache.block_manager import Sequence as BlockTable
from engine.models import prefill_batch
from engine.step.batch_sampling import sample_rows
from engine.step.decode import MIN_BUCKET, Decoder, bucket, capture_graphs

GRAPH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # rows a captured step holds


def padded_rows(n: int, most: int) -> int:
    """The captured size a step of n rows runs in: the next of GRAPH_SIZES (at most `most`)."""
    return min(next((s for s in GRAPH_SIZES if s >= n), n), max(most, n))


class BatchTables:
    """One device row of block ids per slot of a batched step ([rows, max_blocks] int32, entries
    past a sequence's blocks naming the scratch block), written from the host only where a row
    changed: a running sequence's blocks only grow, so a step usually writes nothing. With
    sliding layers (cache.sliding), a second table of each row's ring (`ring`: entry i the
    sliding block of logical block i, cache/sliding_pool.py)."""

    def __init__(self, rows: int, cache, device: torch.device):
        self.max_blocks = len(cache._table)
        self.scratch = (cache.scratch, cache._ring_tables.scratch)
        new = lambda s: torch.full((rows, self.max_blocks), s, dtype=torch.int32,  # noqa: E731
                                   device=device)
        self.table = new(cache.scratch)
        self.ring = new(self.scratch[1]) if cache.sliding else None
        self._ring_size = cache._pool.ring if cache.sliding else 0
        self._held: list[tuple[object, list[int]]] = [(None, []) for _ in range(rows)]
        self.writes = 0  # rows written so far (a tensor-parallel rank 0 sends them on a change)

    def set(self, row: int, key: object, table: BlockTable) -> None:
        """Row `row` holds the blocks of `table`, the sequence known by `key` (same key: the same
        blocks so far, perhaps more of them)."""
        held_key, held = self._held[row]
        if held_key == key and list(table.block_ids) == held:
            return
        self.writes += 1
        block_ids = table.block_ids
        tables = [(self.table, block_ids.__getitem__, self.scratch[0])]
        if self.ring is not None:
            ring, size = table.ring, self._ring_size
            tables.append((self.ring, lambda i: ring[i % size], self.scratch[1]))
        for t, entry, scratch in tables:
            if held_key == key and len(block_ids) >= len(held):
                for i in range(len(held), len(block_ids)):  # a block every block_size steps
                    t[row, i:i + 1].fill_(entry(i))
            else:
                ids = [entry(i) for i in range(len(block_ids))]
                ids += [scratch] * (self.max_blocks - len(block_ids))
                t[row].copy_(torch.tensor(ids, dtype=torch.int32), non_blocking=False)
        self._held[row] = (key, list(block_ids))

    def clear(self, row: int) -> None:
        if self._held[row][1]:
            self.set(row, None, BlockTable())


class BatchedDecoder:
    """The batched step and prefill over a Decoder's family step and cache, for up to
    `max_rows` rows. `solo`: a step of one row runs the decoder's own step instead (its graphs:
    a single chat pays nothing for batching), as every row does without a family step."""

    solo = True

    def __init__(self, decoder: Decoder, max_rows: int):
        self.decoder, self.family, self.cache = decoder, decoder.family, decoder.cache
        self.max_rows = padded_rows(max_rows, max_rows)
        device = decoder.device
        self.tables = BatchTables(self.max_rows, self.cache, device)
        self.inputs = torch.zeros(5, self.max_rows, dtype=torch.long, device=device)
        # tokens, positions, each row's bucket, its split count, where its token is on the
        # device (step's on_device): one host-to-device copy a step,
        # from pinned memory (a pageable copy waits for the GPU, and the step before may still
        # run: batch/inflight.py); two buffers in turn, the one before last long copied
        pin = device.type == "cuda"
        self._staging = [torch.zeros(5, self.max_rows, dtype=torch.long, pin_memory=pin)
                         for _ in range(2)]
        self._turn = 0
        self.use_graphs = decoder.mode == "graph" and paged.of(self.cache).in_place
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.capture_s = 0.0
        self._pool = None
        self._splits: dict[int, int] = {}

    def _split_count(self, kv_len: int) -> int:
        n = self._splits.get(kv_len)
        if n is None:
            n = self._splits[kv_len] = paged.of(self.cache).splits(kv_len)
        return n

    def together(self, chunks: list[prefill_batch.PassRow]) -> bool:
        """Whether these prefill chunks run in one pass: two or more, each one the decoder
        would run through the family step alone (never in the reproducible mode, whose chunks
        run row by row as decode steps, nor over sliding layers' rings: cache/sliding_pool.py)."""
        d = self.decoder
        return (len(chunks) > 1 and not d.reproducible and not self.cache.sliding
                and all(d.family_prefills(c.start, len(c.token_ids)) for c in chunks))

    @torch.inference_mode()
    def prefill(self, chunks: list[prefill_batch.PassRow], tables: list[BlockTable],
                together: bool | None = None) -> tuple[list[torch.Tensor], bool]:
        """Prefill chunks of several sequences (tables[i]: chunk i's sequence's blocks, reserved
        past it) -> (each chunk's next-token logits [V], whether they ran in one pass): in one
        pass of the family step where `together` (None: self.together), else a pass each
        through the decoder's own prefill, its sequence's table bound to the cache."""
        d = self.decoder
        if self.together(chunks) if together is None else together:
            logits = prefill_batch.run(d.family, chunks, lambda end: bucket(d.buckets, end),
                                       self.tables.max_blocks, self.cache.scratch, d.device)
            return list(logits), True
        out = []
        for chunk, table in zip(chunks, tables, strict=True):
            self.cache.bind(table)
            ids = torch.tensor(chunk.token_ids, dtype=torch.long, device=d.device)
            row = d.forward(ids, chunk.start)
            out.append(row.clone() if len(chunks) > 1 else row)  # a graph's buffer is reused
        return out, False

    def decode(self, rows: list, samplers: list, inflight) -> tuple[list, torch.Tensor | None]:
        """A step's one-token rows (batch/sequence.py Chunks, each by its request's Sampler) ->
        (the sequences sampled, their next tokens [n] on the device): two or more together, one
        alone (or each, without a family step) through the decoder's own step; a row whose
        token the step before sampled reads it on the device (`inflight`: batch/inflight.py)."""
        if self.family is None or (len(rows) == 1 and self.solo):
            return self._each_alone(rows, samplers, inflight)
        on_device = None
        if inflight:  # rows whose token is the last step's read it on the device
            where = (inflight.index(c.seq, c.start) for c in rows)
            on_device = (inflight.tokens, [-1 if i is None else i for i in where])
        logits = self.step([c.seq.token_at(c.start) for c in rows], [c.start for c in rows],
                           [((c.seq, c.seq.arrival), c.seq.table) for c in rows],
                           on_device)
        chosen = [i for i, c in enumerate(rows) if c.sample]
        if not chosen:
            return [], None
        return [rows[i].seq for i in chosen], sample_rows(
            [samplers[i] for i in chosen], logits[chosen] if len(chosen) < len(rows) else logits)

    def _each_alone(self, rows: list, samplers: list,
                    inflight) -> tuple[list, torch.Tensor | None]:
        """Each row through the decoder's own single-sequence step over its sequence's blocks,
        sampled by its own Sampler: a batch of one's row (the Decoder's graphs), and every row
        over transformers' modules, which take one sequence a call: one at a time, here only."""
        seqs, tokens = [], []
        for c, sampler in zip(rows, samplers, strict=True):
            self.cache.bind(c.seq.table)
            i = inflight.index(c.seq, c.start)
            token = inflight.tokens[i:i + 1] if i is not None else torch.tensor(
                [c.seq.token_at(c.start)], dtype=torch.long, device=self.decoder.device)
            logits = self.decoder.step(token, c.start)
            if c.sample:
                seqs.append(c.seq)
                tokens.append(sampler(logits))
        return seqs, (None if not tokens else tokens[0] if len(tokens) == 1 else
                      torch.cat(tokens))

    @torch.inference_mode()
    def step(self, tokens: list[int], positions: list[int],
             tables: list[tuple[object, BlockTable]],
             on_device: tuple[torch.Tensor, list[int]] | None = None) -> torch.Tensor:
        """Row i: token tokens[i] at positions[i] of the sequence whose blocks (already reserved
        past that position) are tables[i] = (key, its block table) -> logits [N, V] (in a graph's
        static buffer: use them before the next step). on_device = (ids [m] on the device,
        where): row i's token is ids[where[i]] instead wherever where[i] >= 0."""
        n, lens = self.stage(tokens, positions, tables, on_device)
        return self.launch(n, max(lens), lens)[:len(tokens)]

    def stage(self, tokens: list[int], positions: list[int],
              tables: list[tuple[object, BlockTable]],
              on_device: tuple[torch.Tensor, list[int]] | None = None
              ) -> tuple[int, list[int]]:
        """A step's inputs and block tables into the device buffers -> (rows it runs, padding
        included; each row's KV bucket)."""
        N = len(tokens)
        if N > self.max_rows:
            raise ValueError(f"{N} rows for a batched step of at most {self.max_rows}")
        n = padded_rows(N, self.max_rows) if self.use_graphs else N
        buckets = self.decoder.buckets
        lens = [bucket(buckets, p + 1) for p in positions] + [MIN_BUCKET] * (n - N)
        where = on_device[1] if on_device is not None else [-1] * N
        host = torch.tensor([list(tokens) + [0] * (n - N), list(positions) + [0] * (n - N),
                             lens, [self._split_count(L) for L in lens],
                             list(where) + [-1] * (n - N)], dtype=torch.long)
        stage = self._staging[self._turn]
        self._turn ^= 1
        stage[:, :n].copy_(host)
        self.inputs.copy_(stage, non_blocking=True)  # whole: a strided copy would stage again
        if on_device is not None:
            src = self.inputs[4, :N]
            self.inputs[0, :N] = torch.where(src >= 0, on_device[0][src.clamp(min=0)],
                                             self.inputs[0, :N])
        for i, (key, table) in enumerate(tables):
            self.tables.set(i, key, table)
        for i in range(N, n):  # padding rows write their K/V into the scratch block
            self.tables.clear(i)
        return n, lens

    def launch(self, n: int, kv_len: int, lens: list[int] | None) -> torch.Tensor:
        """The staged step of n rows over buckets up to kv_len -> logits [n, V] (`lens`: the
        rows' buckets on the host, for the eager paths)."""
        if not self.use_graphs:
            rows = BatchRows(self.tables.table[:n], self.inputs[2, :n], self.inputs[3, :n],
                             kv_len, tuple(lens), self._ring(n))
            return self.family.batch(self.inputs[0, :n], self.inputs[1, :n], rows)
        key = (n, kv_len)
        if key not in self.graphs:
            self._capture(n, kv_len)
        graph, logits = self.graphs[key]
        graph.replay()
        return logits[:n]

    def _ring(self, n: int) -> torch.Tensor | None:
        return None if self.tables.ring is None else self.tables.ring[:n]

    def _capture(self, n: int, kv_len: int) -> None:
        """Capture the step of n rows over buckets up to kv_len, with this step's inputs in
        place: its warm-up runs write the same K/V the replay writes."""
        rows = BatchRows(self.tables.table[:n], self.inputs[2, :n], self.inputs[3, :n], kv_len,
                         None, self._ring(n))
        body = lambda: self.family.batch(self.inputs[0, :n], self.inputs[1, :n], rows)  # noqa: E731
        t0 = time.perf_counter()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        self.graphs.update(capture_graphs({(n, kv_len): body}, self._pool))
        self.capture_s += time.perf_counter() - t0
