"""BatchRun: many generations of one Session at once, in continuous batches.

Every request is a sequence with its own blocks in the session's arena (batch/scheduler.py plans
each step under a token budget: running decodes first, then chunked prefill of waiting sequences;
the newest is preempted and later recomputed when blocks run out). A step runs its prefill
chunks and its one-token rows through the session's batched decoder (step/batched.py; over
every rank of a split model, parallel/batch_ops.py): one row through the Decoder's own step
where that decoder is `solo` (its graphs: a single chat pays nothing for batching). Each request
keeps its own sampler (sampling parameters, seed), detokenizer, stop strings, eos, loop guard
and token limit, and its events go to its own sink, ending in one Finished or Failed. A step's
tokens reach the host while the next step runs (batch/inflight.py), and its events go out then.
A speculative request (prompt lookup, or a draft model's, whose draft keeps a sequence per row
in its own arena) speculates here, its verify rows beside the plain ones
(batch/speculative_rows.py; on one device, or every rank of a split model for prompt lookup).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import torch

from engine.batch.inflight import UNKNOWN, InFlight
from engine.batch.scheduler import Scheduler, TooLong
from engine.batch.sequence import Seq, State
from engine.batch.speculative_rows import SpeculativeRows
from engine.events import (
    BadRequest,
    Failed,
    Finished,
    GenerateRequest,
    PrefillProgress,
    Token,
)
from engine.generate import loop_guard, session_events
from engine.generate.generation import Generation, new_generation
from engine.generate.template_guard import RenderCancelled
from engine.models import prefill_batch
from engine.plan.oom import memory_kind

STATS_INTERVAL_S = 0.25


class BatchRun:
    """The batched generations of `session` (a Session on one device, whatever its decode path,
    or a model split across ranks)."""

    def __init__(self, session, max_seqs: int, on_given_out: Callable[[], None] = lambda: None):
        self.session, self.on_given_out = session, on_given_out  # called once a step's events
        # are out, while the GPU still runs the next (the server wakes its loop then)
        self.decoder, self.cache = session.decoder, session.cache
        self.max_seqs = max_seqs
        # a step's tokens: no prefill chunk longer than the planner's largest pass
        self.scheduler = Scheduler(self.cache.blocks, max_seqs,
                                   token_budget=max(session.prefill_chunk, max_seqs))
        self.batched = session.batched_decoder(max_seqs)
        self.gens: dict[Seq, Generation] = {}
        self.history: list[int] = []  # the last finished sequence's ids (generate/prompt.py)
        self._bound = False  # the cache's own live sequence is released while a batch runs
        self._ids = 0
        self.rows_seen: Counter[int] = Counter()  # one-token rows a step -> how many steps
        self.prefill_passes: Counter[int] = Counter()  # chunks a prefill pass -> how many passes
        self._pending: dict[Generation, int] = {}  # tokens on the host, not yet given out
        self.inflight = InFlight()  # the last step's tokens, on the device while the next runs
        self.spec = SpeculativeRows(session, max_seqs)

    # ------------------------------------------------------------------ requests

    @property
    def has_work(self) -> bool:
        return bool(self.gens)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def add(self, req: GenerateRequest, sink: Callable[[object], None],
            cancel: threading.Event | None = None) -> None:
        """Admit `req` at the next step, or end it at once (bad input: Failed)."""
        cancel = cancel or threading.Event()
        try:
            self._ids += 1
            gen = new_generation(self.session, f"b{self._ids}", req, sink, cancel,
                                 self.history)
        except BadRequest as e:
            return sink(Failed(str(e), bad_input=True))
        except RenderCancelled:
            return sink(Finished("cancelled"))
        self.spec.add(gen.seq, req, gen.sampler, capture=not self._bound)
        if not self._bound:
            self.cache.release()  # its full blocks stay cached by hash for the batch to share
            self._bound = True
        self.gens[gen.seq] = gen
        try:
            self.scheduler.add(gen.seq)
        except TooLong as e:
            del self.gens[gen.seq]
            self.spec.drop(gen.seq)
            self._idle()
            sink(Failed(str(e), bad_input=True))

    # ------------------------------------------------------------------ one step

    def step(self) -> None:
        """Plan and run one step; every request that ends in it gets its terminal event."""
        cancelled = [g for g in self.gens.values() if g.cancel.is_set()]
        if cancelled:
            self._resolve()
        for gen in cancelled:  # a token sampled but not given out yet is not its answer:
            self._pending.pop(gen, None)  # it ends with the tokens given out before the cancel
            if gen.seq in self.gens:
                self._end(gen, "cancelled")
        if not self.gens:
            return self._idle()
        threads = self.session.threads
        if threads is not None:
            threads.tick()
        try:
            self._step()
        except Exception as e:  # every stream ends in one Failed, whatever broke
            self._fail_all(e)
        self._idle()

    def _step(self) -> None:
        if self.spec.rows:  # proposals from the host's tokens, before the plan takes them
            if self.spec.waits_on(self.inflight):
                self._resolve()
            self.spec.propose(crowded=len(self.gens) > 1)
        plan = self.scheduler.schedule()
        for chunk in plan.chunks:
            gen = self.gens[chunk.seq]
            if not gen.admitted:
                gen.admitted, gen.cached = True, chunk.start
        sampled: dict[Seq, torch.Tensor] = {}  # a prefill chunk's next token, [1] on the device
        # a token below seq.keep is a prefill's: only its own pass skips shared blocks there
        rows = [c for c in plan.chunks if c.length == 1 and c.start >= c.seq.table.keep]
        self.rows_seen[len(rows)] += 1
        prefills = [c for c in plan.chunks if c not in rows and not c.spec]
        if prefills:
            logits, together = self.batched.prefill(
                [prefill_batch.PassRow(c.token_ids, c.start, c.seq.table.block_ids)
                 for c in prefills], [c.seq.table for c in prefills])
            self.prefill_passes.update([len(prefills)] if together else [1] * len(prefills))
        for j, c in enumerate(prefills):
            gen = self.gens[c.seq]
            if c.sample:
                sampled[c.seq] = gen.sampler(logits[j])
                if gen.t_first is None and self.decoder.device.type == "cpu":  # computed by now:
                    gen.t_first = time.perf_counter()  # its time, not that of a step later
            self._progress(gen, c)
        row_seqs, row_tokens = self.batched.decode(
            rows, [self.gens[c.seq].sampler for c in rows], self.inflight) if rows else ([], None)
        verified = self.spec.verify(plan.chunks, self.batched)
        # the GPU runs this step while the host takes the last one's tokens (one copy, which
        # waits for that step only) and gives them out (text, stop strings, events): a sequence
        # that ended there ran one row more, and its token is dropped
        self._resolve()
        self._flush()
        self.on_given_out()
        # this step's tokens stay on the device (each chunk's, then the batched rows'): the
        # next step is planned and launched before they reach the host
        order = list(sampled) + row_seqs
        parts = list(sampled.values()) + ([row_tokens] if row_seqs else [])
        at = [len(seq.output_ids) for seq in order]
        self.scheduler.finish_step(plan, dict.fromkeys(order, UNKNOWN), verified)
        held = [(seq, i, n) for i, (seq, n) in enumerate(zip(order, at, strict=True))
                if len(seq.output_ids) > n]  # not those that ended while it ran
        if held:
            self.inflight.hold(torch.cat(parts), held)
        for seq, tokens in verified.items():  # on the host already: given out now
            gen = self.gens.get(seq)
            for i, tid in enumerate(tokens if gen is not None else ()):
                if seq not in self.gens:  # it ended before these: they are not its answer
                    self.history = self.history[:i - len(tokens)]
                    break
                self._emit(gen, tid)

    def _resolve(self) -> None:
        for seq, tid in self.inflight.resolve().items():
            gen = self.gens.get(seq)
            if gen is not None:
                self._pending[gen] = tid

    def _flush(self) -> None:
        """Give out the tokens of the step before (its sequences' ends too)."""
        pending, self._pending = self._pending, {}
        for gen, tid in pending.items():
            if gen.seq in self.gens:
                self._emit(gen, tid)

    def _progress(self, gen: Generation, chunk) -> None:
        """Where a prompt takes several chunks: how much of it is done."""
        prompt, total = len(gen.seq.prompt_ids), len(gen.seq.prompt_ids) - gen.cached
        if total > self.session.prefill_chunk and chunk.start < prompt:
            gen.sink(PrefillProgress(min(chunk.start + chunk.length, prompt) - gen.cached, total))

    def _emit(self, gen: Generation, tid: int) -> None:
        """The request's new token: its text, and its end where it ends."""
        if gen.t_first is None:
            gen.t_first = time.perf_counter()
        gen.n_new += 1
        lm = self.session.lm
        if tid in lm.eos_ids and not gen.req.ignore_eos:
            gen.sink(gen.sampler.token("", (tid,), last=True))
            return self._end(gen, "eos")
        piece, stopped = gen.stop.feed(gen.detok.add(tid))
        ids = gen.seq.output_ids  # a verify row's later tokens are not given out yet
        reason = loop_guard.end_reason(gen.req, ids if len(ids) == gen.n_new else
                                       ids[:gen.n_new], stopped, gen.n_new,
                                       gen.seq.max_new_tokens, gen.sampler)
        if reason:
            gen.sink(gen.sampler.token(piece + ("" if stopped else gen.stop.flush()), (tid,),
                                       last=True))
            return self._end(gen, reason)
        gen.sink(gen.sampler.token(piece, (tid,)))
        now = time.perf_counter()
        if now - gen.last_stats > STATS_INTERVAL_S:
            gen.last_stats = now
            gen.sink(self._stats(gen))

    def _end(self, gen: Generation, reason: str) -> None:
        seq = gen.seq
        if reason == "cancelled":
            tail = gen.stop.flush()
            if tail:
                gen.sink(Token(tail, ()))
        if seq.state is not State.FINISHED:
            self.scheduler.finish(seq, reason)
        self.history = seq.token_ids if reason != "cancelled" else \
            seq.token_ids[:len(seq.prompt_ids) + gen.n_new]  # what it gave out
        del self.gens[seq]
        stats = self._stats(gen)
        self.spec.drop(seq)
        gen.sink(Finished(reason, stats))

    def _stats(self, gen: Generation):
        ids = gen.seq.prompt_ids
        return session_events.stats(self.session, ids, gen.n_new, gen.t_start, gen.t_first,
                                    gen.cached, gen.dropped, self.spec.stats_of(gen.seq))

    def _fail_all(self, e: Exception) -> None:
        try:  # the tokens that were sampled are given out before the failure
            self._resolve()
            self._flush()
        except Exception:  # noqa: BLE001 - the failure below is what the streams are told
            self._pending.clear()
            self.inflight = InFlight()
        kind = memory_kind(e) if not isinstance(e, torch.OutOfMemoryError) else "GPU"
        if kind:
            failed = session_events.oom_failure(self.session, kind)
        else:
            failed = Failed(f"generation failed: {type(e).__name__}: {e}")
        gens = list(self.gens.values())
        self.gens.clear()
        if self._bound:
            self.cache.unbind()
            self._bound = False
        self.cache.clear()  # whatever broke mid-pass, no cached block is trusted
        self.scheduler = Scheduler(self.cache.blocks, self.max_seqs,
                                   self.scheduler.token_budget)
        self.batched = self.session.batched_decoder(self.max_seqs)
        self.spec.clear()
        self.spec = SpeculativeRows(self.session, self.max_seqs)
        for gen in gens:
            gen.sink(failed)

    def _idle(self) -> None:
        """Nothing left: the cache gets a live sequence of its own again (a session of one may
        run next)."""
        if not self.gens and self._bound:
            self.cache.unbind()
            self._bound = False

