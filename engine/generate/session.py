"""Session: one loaded model, its cache and decoder; `Session.generate(request, cancel)` runs a
generation as a batch of one through the session's own BatchRun (generate/batch_run.py, the loop
every generation runs in: prefix reuse by hash, earlier answers kept as generated ids, prompt
lookup and a draft model speculating inside it), but the benchmark's synthetic draft, which runs
one sequence by itself (`_speculate_alone`). Every
stream ends in exactly one `Finished` or `Failed`. Loading and the configuration (KV dtype,
prefill chunk, backends: one EngineConfig) are session_load.py's."""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import torch

from engine.attention import decode_attention
from engine.config.engine_config import EngineConfig, SpeculationSettings
from engine.events import (
    BadRequest,
    Failed,
    Finished,
    GenerateRequest,
    Loaded,
    LoadProgress,
    LoadRequest,
    PrefillProgress,
    Stats,
    Token,
)
from engine.generate import loop_guard, session_events
from engine.generate.batch_run import STATS_INTERVAL_S, BatchRun
from engine.generate.detokenizer import StopMatcher, detokenizer_for
from engine.generate.generation import checked_prompt
from engine.generate.prompt import build as build_prompt
from engine.generate.session_load import load_session, open_cache, resolve_config
from engine.generate.template_guard import RenderCancelled
from engine.load import loader
from engine.plan.oom import memory_kind
from engine.platform import cpu_threads
from engine.spec.controller import MAX_ADAPTIVE_K, Controller
from engine.spec.speculative import SpeculativeDecoding
from engine.step.batched import BatchedDecoder
from engine.step.decode import DecodeEngine, Decoder
from engine.step.sampling import Sampler


class Session:
    """`config`: the load's EngineConfig (session_load.resolve_config); without one it is
    resolved here from `lm` and the other arguments (benchmarks and tests that build a model
    themselves)."""

    _batch = None  # own_batch(): where this session's own generations run

    def __init__(self, lm: loader.LoadedModel, kv_dtype: str = "auto", fast_path: bool = True,
                 compile_layers: bool = False, *, config: EngineConfig | None = None,
                 reproducible: bool | None = None, kv_tokens: int | None = None):
        self.lm = lm
        self.config = config or self._configure(lm, kv_dtype, fast_path, compile_layers,
                                                reproducible)
        if kv_tokens is not None:
            self.config = replace(self.config, kv_tokens=kv_tokens)
        self._init_speculation(self.config.speculation.num_speculative_tokens)
        self.speculation = self.config.speculation
        self.kv_dtype, self.kv_reason = self.config.kv_dtype, self.config.kv_reason
        self.decoder, self.kernel_note = self._open_decoder()
        self.cache = self.decoder.cache
        self.prefill_chunk = self.config.prefill_chunk
        self.threads = cpu_threads.governor_for(lm.device)  # fewer while the CPU is busy elsewhere
        if self.config.fast_path:
            # the reproducible mode holds under every thread count the governor may choose
            counts = None
            if self.config.reproducible:
                counts = (1, torch.get_num_threads()) if self.threads is not None else ()
            self.decoder.setup_fast_path(allow_graph=self.config.allow_graph,
                                         compile_layers=self.config.compile_layers,
                                         reproducible=counts)
            if self.decoder.fixed_threads:
                self.threads = None

    def _configure(self, lm: loader.LoadedModel, kv_dtype: str, fast_path: bool,
                   compile_layers: bool, reproducible: bool | None = None) -> EngineConfig:
        """The configuration where none was given (TPSession: for one rank's share)."""
        return resolve_config(lm, kv_dtype, fast_path, compile_layers,
                              reproducible=reproducible)

    def _open_decoder(self) -> tuple[DecodeEngine, str | None]:
        """(the decoder over a new cache, the decode kernel's load-check note): the cache reads
        and writes as self.config.backends say, and records a kernel that fails its check in
        its own KernelHealth (this session's, not the process's)."""
        lm = self.lm
        cache = open_cache(lm, self.config, self.kv_dtype)
        note = decode_attention.check_kernel(cache, lm.model.config.num_attention_heads,
                                             lm.compute_dtype)
        return Decoder(lm.model, cache, lm.device), note

    def _init_speculation(self, num_speculative_tokens: int | None = None) -> None:
        """Speculative decoding's state (attach_draft; prompt lookup needs no setup)."""
        self.draft: Session | None = None
        self.synthetic = None  # bench only: a proposers.SyntheticDraft over self.draft
        self.speculation = SpeculationSettings(num_speculative_tokens)
        # one per way of speculating; they remember timings and switch-offs across generations
        self.controllers: dict[tuple, Controller] = {}

    def configure_speculation(self, **changes) -> None:
        """Replace fields of the SpeculationSettings in force (num_speculative_tokens, adaptive,
        switch_off) from the next generation on; the load's is self.config.speculation."""
        self.speculation = replace(self.speculation, **changes)

    # shorthands for configure_speculation (tests speculate every step with both off)
    num_speculative_tokens = property(
        lambda self: self.speculation.num_speculative_tokens,
        lambda self, k: self.configure_speculation(num_speculative_tokens=k))
    adaptive = property(lambda self: self.speculation.adaptive,
                        lambda self, on: self.configure_speculation(adaptive=on))
    switch_off = property(lambda self: self.speculation.switch_off,
                          lambda self, on: self.configure_speculation(switch_off=on))

    @classmethod
    def load(cls, req: LoadRequest, progress: Callable[[LoadProgress], None] = lambda e: None,
             cancel: threading.Event | None = None) -> Session:
        """Raises oom.OutOfMemory (memory released, a hint that fits) when the card is full."""
        return load_session(cls, req, progress, cancel)

    def attach_draft(self, draft: Session, proposer=None) -> None:
        """Speculate with `draft` (same tokenizer, same device) from the next generation on;
        `proposer`: one over it in place of its own proposals (the bench's SyntheticDraft)."""
        self.draft = draft
        self.synthetic = proposer
        self.decoder.capture_blocks(range(2, (self.num_speculative_tokens or MAX_ADAPTIVE_K) + 2))

    def batched_decoder(self, max_rows: int) -> BatchedDecoder:
        """The passes of a batch of up to max_rows sequences (generate/batch_run.py)."""
        return BatchedDecoder(self.decoder, max_rows)

    def loaded_event(self) -> Loaded:
        return session_events.loaded(self)

    def prompt_ids(self, req: GenerateRequest) -> list[int]:
        """The ids a generation of `req` would prefill now (generate/prompt.py)."""
        return build_prompt(self.lm.tokenizer, req, self._history(), self.lm.context).ids

    def generate(self, req: GenerateRequest, cancel: threading.Event | None = None
                 ) -> Iterator[Token | Stats | PrefillProgress | Finished | Failed]:
        """The request's events, ending in one Finished or Failed: a batch of one through
        `own_batch()`, but the benchmark's synthetic draft (`_speculate_alone`)."""
        cancel = cancel or threading.Event()
        if not self._speculates_alone(req):
            return (yield from self._batch_of_one(req, cancel))
        oom = None  # "GPU" or "CPU" when an allocator ran out of memory
        try:
            yield from self._speculate_alone(req, cancel)
        except BadRequest as e:
            yield Failed(str(e), bad_input=True)
        except RenderCancelled:  # cancelled while the chat template rendered: nothing ran yet
            yield Finished("cancelled", Stats(pid=os.getpid()))
        except torch.OutOfMemoryError:
            oom = "GPU"  # answered below, outside the except block that holds the activations
        except Exception as e:  # the stream must end in one Failed, whatever broke
            oom = memory_kind(e)  # the CPU allocator's RuntimeError, a MemoryError
            if oom is None:
                self._forget()
                yield Failed(f"generation failed: {type(e).__name__}: {e}")
        if oom:
            self._forget()
            yield session_events.oom_failure(self, oom)

    def own_batch(self):
        """The BatchRun of this session's own generations (`generate`); anew after a clear."""
        batch = self._batch
        if batch is None or (batch.scheduler.blocks is not self.cache.blocks
                             and not batch.has_work):
            batch = self._batch = BatchRun(self, max_seqs=1)
        batch.history = self._history()
        return batch

    def _history(self) -> list[int]:
        """The last conversation's ids (generate/prompt.py): the live sequence's after a draft's
        speculation, else the batch's; none since a clear."""
        b = self._batch
        return list(self.cache.token_ids) or (b.history if b is not None
                                              and b.scheduler.blocks is self.cache.blocks else [])

    def _batch_of_one(self, req: GenerateRequest, cancel: threading.Event):
        """The request's events through the batch loop, each step's as it gives them out; a
        caller that stops reading cancels it, and it ends at the next step."""
        batch, events = self.own_batch(), collections.deque()
        batch.add(req, events.append, cancel)
        ended = False
        try:
            while not ended:
                if not events:  # a batch ends each of its requests with one event
                    if not batch.has_work:
                        events.append(Failed("generation failed: the batch dropped it"))
                    batch.step()
                    continue
                event = events.popleft()
                ended = isinstance(event, Finished | Failed)
                yield event
        finally:
            if not ended:
                cancel.set()
                while batch.has_work and not any(isinstance(e, Finished | Failed) for e in events):
                    batch.step()

    def _speculates_alone(self, req: GenerateRequest) -> bool:
        """Whether `req` speculates with the benchmark's synthetic draft (`hearth bench
        --synthetic-acceptance`), out of the batch: the one generation that runs in
        `_speculate_alone`."""
        return self.synthetic is not None and not req.prompt_lookup and self._k(req) != 0

    def _k(self, req: GenerateRequest) -> int | None:
        """The request's speculative tokens a round (None: adaptive)."""
        k = req.num_speculative_tokens
        return self.num_speculative_tokens if k is None else k

    def _forget(self) -> None:
        # whatever broke mid-pass, no cached block is trusted
        self.cache.clear()
        if self.draft is not None:
            self.draft.cache.clear()

    def _speculation(self, req: GenerateRequest, sampler: Sampler,
                     ids: list[int]) -> SpeculativeDecoding:
        """The speculation of a request that `_speculates_alone`, with its controller."""
        k, proposer = self._k(req), self.synthetic
        max_k = k or MAX_ADAPTIVE_K
        self.decoder.capture_blocks(range(2, max_k + 2))  # once; a no-op without CUDA graphs
        spec = self.speculation
        key = (proposer.name, max_k, k is None and spec.adaptive, spec.switch_off)
        control = self.controllers.get(key)
        if control is None:
            known = [c.plain_step_s for c in self.controllers.values() if c.plain_step_s]
            control = self.controllers[key] = Controller(max_k, *key[2:], *known[:1])
        control.new_generation()
        return SpeculativeDecoding(self.decoder, self.cache, sampler, proposer, control,
                                   list(ids))

    def _speculate_alone(self, req: GenerateRequest, cancel: threading.Event):
        """The synthetic draft's speculation, one sequence by itself, outside the batch loop."""
        req.validate()
        t_start = time.perf_counter()
        ids, tensor, dropped, max_new, sampler = checked_prompt(
            self.lm, req, self._history(), cancel)
        done, t_first, stop = 0, None, StopMatcher(req.stop)
        base = len(ids) - done  # the prompt's length
        prompt_ids = ids[:base]
        decoding = self._speculation(req, sampler, ids)  # before prefill: it may capture graphs
        # the live conversation's prefix, or another's cached by hash (a shared system prompt);
        # at least the last prompt token is computed: its logits start the answer
        start = self.cache.reuse(ids)
        cached = start
        n_new, generated = done, ids[base:]
        stats = lambda: session_events.stats(self, prompt_ids, n_new, t_start, t_first, cached,
                                             dropped, decoding)
        chunk = self.prefill_chunk
        chunked = len(ids) - start > chunk
        logits = None
        tick = self.threads.tick if self.threads is not None else int
        for lo in range(start, len(ids), chunk):
            tick()
            if cancel.is_set():
                return (yield Finished("cancelled", stats()))
            hi = min(lo + chunk, len(ids))
            logits = self.decoder.forward(tensor[lo:hi], lo)
            self.cache.token_ids = ids[:hi]
            if chunked:
                yield PrefillProgress(hi - start, len(ids) - start)

        detok = detokenizer_for(self.lm.tokenizer, ids)
        last_stats = time.perf_counter()
        new = decoding.first(logits)  # then 1 token a plain step, up to K + 1 a round
        t_first = t_first or time.perf_counter()
        while True:
            text, shown = "", []
            for tid in new:
                n_new += 1
                shown.append(tid)
                generated.append(tid)
                if tid in self.lm.eos_ids and not req.ignore_eos:
                    yield sampler.token(text, shown, last=True)
                    return (yield Finished("eos", stats()))
                piece, stopped = stop.feed(detok.add(tid))
                text += piece
                reason = loop_guard.end_reason(req, generated, stopped, n_new, max_new, sampler)
                if reason:
                    text += "" if stopped else stop.flush()
                    yield sampler.token(text, shown, last=True)
                    return (yield Finished(reason, stats()))
            yield sampler.token(text, shown)
            if cancel.is_set():
                tail = stop.flush()
                if tail:
                    yield Token(tail, ())
                return (yield Finished("cancelled", stats()))
            if time.perf_counter() - last_stats > STATS_INTERVAL_S:
                last_stats = time.perf_counter()
                yield stats()
            tick()
            # the pending token (the last shown) goes at the prompt's length + n_new - 1
            new = decoding.next(base + n_new - 1, max_new - n_new)

