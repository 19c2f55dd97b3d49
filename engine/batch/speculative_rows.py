"""The speculative requests of a batch (generate/batch_run.py), speculating beside plain rows:
before a step is planned each proposes tokens after its pending one (prompt lookup, or the
draft model, whose rows draft together: spec/draft_rows.py); the scheduler fits them into the
step's token budget and reserves their blocks (a verify row: the
pending token and K proposals, K + 1 positions whose logits are all needed); the step verifies
every such row in one pass (the batched decoder's prefill, models/prefill_batch.py, on every
rank of a split model; one row alone through the Decoder's own verify block where the batch is
`solo`, as a session of one runs it); each row keeps what spec/speculative.py's accept
rule keeps (greedy or sampled, under its grammar's masks, with its logprobs), and its rejected
positions are simply overwritten later. K and the switch-off stay per request
(spec/controller.py), timed by the steps the request ran in.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.batch.sequence import Chunk, Seq, State
from engine.models import prefill_batch
from engine.spec.constrained_verify import DraftedGrammar
from engine.spec.controller import MAX_ADAPTIVE_K, Controller
from engine.spec.draft_rows import Ask, DraftRows, DraftSeq
from engine.spec.proposers import PromptLookup
from engine.spec.speculative import judge, record_logprobs, speculation_stats

if TYPE_CHECKING:
    from engine.batch.inflight import InFlight
    from engine.events import GenerateRequest
    from engine.step.batched import BatchedDecoder
    from engine.step.sampling import Sampler


def speculative_k(req: GenerateRequest, session) -> int | None:
    """The request's K (None: adaptive) where it speculates inside a batch, by prompt lookup or
    with the session's draft model; else 0: it decodes plainly."""
    k = req.num_speculative_tokens
    k = session.num_speculative_tokens if k is None else k
    asks = req.prompt_lookup or getattr(session, "draft", None) is not None
    return k if asks else 0


@dataclass(eq=False)
class SpecRow:
    """One request's speculation: its proposer, its controller, and what its last step was."""

    proposer: PromptLookup | DraftSeq
    control: Controller
    sampler: Sampler
    started: bool = False
    last: tuple | None = None  # ("round", proposed, accepted, propose_s, timed) or ("plain",):
    # judged by the time of its step, known once the next step starts
    propose_s: float = 0.0
    grammar: DraftedGrammar | None = None  # this step's, for a constrained request
    q: torch.Tensor | None = field(default=None, repr=False)

    def stats(self) -> dict:
        return speculation_stats(self.control, self.proposer.name)


class SpeculativeRows:
    """The speculating requests of one BatchRun, by sequence."""

    def __init__(self, session, max_rows: int):
        self.session, self.decoder, self.max_rows = session, session.decoder, max_rows
        self.rows: dict[Seq, SpecRow] = {}
        self.draft: DraftRows | None = None  # the draft model's rows, from the first
        self._t: float | None = None  # when the step before began proposing
        self._crowded = False  # whether the step before shared the batch with other sequences
        self.passes: Counter[int] = Counter()  # verify rows a pass -> how many passes

    def add(self, seq: Seq, req: GenerateRequest, sampler: Sampler, capture: bool) -> None:
        """Speculate for `seq` where its request asks (`capture`: the cache has no batch
        bound, so its verify blocks may be captured now, once)."""
        s = self.session
        k = speculative_k(req, s)
        if k == 0:
            return
        max_k = k or MAX_ADAPTIVE_K
        if capture:
            self.decoder.capture_blocks(range(2, max_k + 2))  # a no-op without CUDA graphs
        spec = s.speculation
        control = Controller(max_k, k is None and spec.adaptive, spec.switch_off)
        if req.prompt_lookup:
            proposer = PromptLookup(s.lm.device)
        else:
            if self.draft is None:
                self.draft = DraftRows(s.draft, s.lm.model.config.vocab_size, self.max_rows)
            proposer = DraftSeq()
            if s.synthetic is not None:  # the benchmark's: its stats say so
                proposer.name = s.synthetic.name
        self.rows[seq] = SpecRow(proposer, control, sampler)

    def drop(self, seq: Seq) -> None:
        row = self.rows.pop(seq, None)
        if row is not None and isinstance(row.proposer, DraftSeq):
            self.draft.release(row.proposer)  # its blocks go back to the draft arena

    def clear(self) -> None:
        """After a failed step: the draft arena forgets everything."""
        if self.draft is not None:
            self.draft.clear()

    def stats_of(self, seq: Seq) -> SpecRow | None:
        """The row whose stats a Stats event reports, its last round counted (not timed)."""
        row = self.rows.get(seq)
        if row is not None and row.last is not None and row.last[0] == "round":
            self._judge(row, None)
        return row

    def waits_on(self, inflight: InFlight) -> bool:
        """Whether a speculating sequence's last token is still on the device (it proposes
        from the host's copy)."""
        return any(inflight.index(seq, seq.num_tokens - 1) is not None for seq in self.rows)

    # ------------------------------------------------------------------ before the plan

    def propose(self, crowded: bool = False) -> None:
        """Each decoding row's proposals into seq.spec_ids (the scheduler takes what fits);
        the step before is judged first, by its time. `crowded`: other sequences share the
        batch; a request whose switch-off is on (the default) then proposes nothing and decodes
        plainly: on the CPU, verify rows beside plain ones cost more than they return
        (bench/spec_under_load.py: 0.71x at 8 requests, 1.01x at 4), and no step of a crowded
        batch times a plain step of its own."""
        now = time.perf_counter()
        step_s = None if self._t is None or self._crowded else now - self._t
        self._t, self._crowded = now, crowded
        asks: dict[Seq, Ask] = {}
        for seq, row in self.rows.items():
            self._judge(row, step_s)
            row.grammar, row.q = None, None
            drafted = isinstance(row.proposer, DraftSeq)
            if drafted and seq.state is State.WAITING:  # preempted: recomputed later
                self.draft.release(row.proposer)
            if seq.state is not State.RUNNING or seq.num_pending != 1 or (
                    crowded and row.control.switch_off):
                continue
            k = row.control.next_k(seq.max_new_tokens - len(seq.output_ids) - 1)
            if not k:
                continue
            row.grammar = None if row.sampler.grammar is None else DraftedGrammar(
                row.sampler.grammar)
            if drafted:  # the draft's rows propose together, below
                asks[seq] = Ask(row.proposer, seq.token_ids, k, row.sampler, row.grammar)
                continue
            t0 = time.perf_counter()
            if not row.started:
                row.proposer.start(seq.prompt_ids)
                row.started = True
            self._take(seq, row, *row.proposer.propose(seq.token_ids, k, row.sampler,
                                                       row.grammar))
            row.propose_s = time.perf_counter() - t0
        if asks:
            t0 = time.perf_counter()
            proposed = self.draft.propose(list(asks.values()))
            seconds = time.perf_counter() - t0  # each row's round waited for all of them
            synthetic = self.session.synthetic  # the benchmark's: its proposals, the draft's cost
            for seq, ask in asks.items():
                row, (proposals, q) = self.rows[seq], proposed[ask.seq]
                if synthetic is not None and proposals is not None:
                    proposals = synthetic.replace(len(seq.token_ids), proposals.numel())
                self._take(seq, row, proposals, q)
                row.propose_s = seconds

    @staticmethod
    def _take(seq: Seq, row: SpecRow, proposals, q) -> None:
        """The row's proposals into seq.spec_ids, cut where its grammar forbids one."""
        grammar = row.grammar
        if grammar is not None and proposals is not None:
            proposals, q = grammar.check(proposals, q)  # cut at the first forbidden token
        if proposals is not None and proposals.numel():  # (none: the grammar took none)
            seq.spec_ids = proposals.tolist()
            row.q = q
        elif grammar is not None:
            if grammar.taken:
                grammar.grammar.rollback(grammar.taken)  # nothing to verify: it forgets them
            row.grammar = None

    @staticmethod
    def _judge(row: SpecRow, step_s: float | None) -> None:
        """Its controller takes the row's last step: a round (timed where it says so) or a plain
        step (timed only)."""
        last, row.last = row.last, None
        if last is not None and last[0] == "round":
            _, proposed, accepted, propose_s, timed = last
            seconds = step_s if timed else None
            row.control.round_done(proposed, accepted, propose_s, (seconds or 0.0) - propose_s,
                                   seconds)
        elif last is not None and step_s is not None:
            row.control.plain_done(step_s)

    # ------------------------------------------------------------------ in the step

    def verify(self, chunks: tuple[Chunk, ...], batched: BatchedDecoder) -> dict[Seq, list[int]]:
        """Run the step's verify rows (chunks with proposals) through `batched`, the batch's
        decoder, and judge each -> its committed tokens (accepted proposals, then the target's
        own), read on the host at once."""
        # a plain step of a speculating row: judged by its time once the next step begins,
        # unless a prefill chunk ran in it (its time is the prompt's, not the rows')
        timed = not any(c.length > 1 and not c.spec for c in chunks)
        for c in chunks:
            row = self.rows.get(c.seq)
            if row is not None and c.length == 1 and c.sample and timed:
                row.last = ("plain",)
        verify = [c for c in chunks if c.spec]
        for seq, row in self.rows.items():  # proposals the plan left out (budget, preemption):
            if row.grammar is not None and not any(c.seq is seq for c in verify):
                row.grammar.grammar.rollback(row.grammar.taken)  # the grammar forgets them
                row.grammar = None
        if not verify:
            return {}
        raws, judged = [], []
        for c, raw in self._passes(verify, batched):
            raws.append(raw)  # kept: no later pass of this step writes where it lives
            row = self.rows[c.seq]
            proposals = torch.tensor(c.spec, dtype=torch.long, device=raw.device)
            K = len(c.spec)  # the plan may have cut the proposals short
            allowed = None if row.grammar is None else row.grammar.masks(raw.device)[:K + 1]
            q = None if row.q is None else row.q[:K]
            judged.append((proposals, *judge(row.sampler, raw, proposals, q, allowed)))
        host = torch.cat([torch.cat([n.view(1), nxt]) for _, n, nxt in judged]).tolist()  # the
        # verify rows' one host sync
        out = {}
        for i, c in enumerate(verify):
            row, accepted = self.rows[c.seq], host[2 * i]
            tokens = list(c.spec[:accepted]) + [host[2 * i + 1]]
            proposals, _, nxt = judged[i]
            record_logprobs(row.sampler, raws[i], proposals, accepted, nxt)
            if row.grammar is not None:
                row.grammar.settle(accepted, tokens[-1])  # rolled back to the accepted length
            row.proposer.commit(tokens[:accepted], len(c.spec))
            row.sampler.mark(tokens)
            row.last = ("round", len(c.spec), accepted, row.propose_s, timed)
            out[c.seq] = tokens
        return out

    def _passes(self, verify: list[Chunk], batched: BatchedDecoder):
        """(chunk, its raw logits [K + 1, V]) per verify row: one pass over every row (the
        batched decoder's prefill: on every rank of a split model), or one row alone through
        the Decoder's verify block where the batch is `solo` (a batch of one's, its graphs), in
        the reproducible mode (its blocks run row by row) and through transformers' modules."""
        d = batched.decoder
        if (len(verify) == 1 and batched.solo) or d.reproducible or d.family is None:
            self.passes[1] += len(verify)
            for c in verify:
                d.cache.bind(c.seq.table)
                ids = torch.tensor(c.token_ids, dtype=torch.long, device=d.device)
                yield c, d.verify(ids, c.start)  # judged before the next pass overwrites it
            return
        self.passes[len(verify)] += 1
        rows, _ = batched.prefill(
            [prefill_batch.PassRow(c.token_ids, c.start, c.seq.table.block_ids, every=True)
             for c in verify], [c.seq.table for c in verify], together=True)
        lo = 0
        for c in verify:
            yield c, torch.stack(rows[lo:lo + c.length])
            lo += c.length
