"""Session: one loaded model, its cache and decoder; `Session.generate(request, cancel)` runs a
generation as a batch of one through the session's own BatchRun (generate/batch_run.py, the loop
every generation runs in: prefix reuse by hash, earlier answers kept as generated ids, prompt
lookup and a draft model speculating inside it). Every
stream ends in exactly one `Finished` or `Failed`. Loading and the configuration (KV dtype,
prefill chunk, backends: one EngineConfig) are session_load.py's."""

from __future__ import annotations

import collections
import os
import threading
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
from engine.generate import session_events
from engine.generate.batch_run import BatchRun
from engine.generate.prompt import build as build_prompt
from engine.generate.session_load import load_session, open_cache, resolve_config
from engine.generate.template_guard import RenderCancelled
from engine.load import loader
from engine.plan.oom import memory_kind
from engine.platform import cpu_threads
from engine.spec.controller import MAX_ADAPTIVE_K
from engine.step.batched import BatchedDecoder
from engine.step.decode import DecodeEngine, Decoder


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
        `own_batch()`."""
        cancel = cancel or threading.Event()
        oom = None  # "GPU" or "CPU" when an allocator ran out of memory
        try:
            yield from self._batch_of_one(req, cancel)
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
        """The last conversation's ids (generate/prompt.py): the cache's live sequence where a
        tool wrote one (hearth eval's pass), else the batch's; none since a clear."""
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
                    if batch.has_work:
                        batch.step()
                    else:
                        events.append(Failed("generation failed: the batch dropped it"))
                    continue
                event = events.popleft()
                ended = isinstance(event, Finished | Failed)
                yield event
        finally:
            if not ended:
                cancel.set()
                while batch.has_work and not any(isinstance(e, Finished | Failed) for e in events):
                    batch.step()

    def _forget(self) -> None:
        # whatever broke mid-pass, no cached block is trusted
        self.cache.clear()
        if self.draft is not None:
            self.draft.cache.clear()
