"""The one thread that owns the model, and the queue every front end puts work on: the app's
worker (JSON lines on stdin), `hearth serve`'s HTTP clients, a benchmark's concurrent prompts.

Each request comes with the sink its events go to and, optionally, an id that a cancel can name.
Work starts in arrival order. Generations run together in continuous batches
(generate/batch_run.py), whatever the model's decode path: each joins at the next step and
leaves at its end, up to `max_seqs` at once, the rest waiting in the batch's queue. Speculation
(prompt lookup or a draft model) runs inside the batch too, beside the plain rows
(batch/speculative_rows.py). A load or unload waits for the generations queued before it, and
generations queued after it run on what it leaves loaded.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.config.engine_config import MAX_SEQS
from engine.events import (
    BadRequest,
    Failed,
    Finished,
    GenerateRequest,
    LoadRequest,
    Token,
    UnloadRequest,
)

if TYPE_CHECKING:
    from engine.generate.batch_run import BatchRun

MAX_WAITING = 256  # generations queued and not yet running; past this, QueueFull


class QueueFull(RuntimeError):
    """Too many generations are waiting: a server answers 503 and the client retries later."""


@dataclass(eq=False)
class Job:
    req: LoadRequest | UnloadRequest | GenerateRequest
    sink: Callable[[object], None]  # every event of this job, ending in one Finished or Failed
    id: str | None = None
    cancel: threading.Event = field(default_factory=threading.Event)


class Engine:
    def __init__(self, max_waiting: int = MAX_WAITING, max_seqs: int = MAX_SEQS):
        self.max_waiting = max_waiting
        self.max_seqs = max_seqs
        self.session = None
        self.batch: BatchRun | None = None  # over self.session, made at its first generation
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._queue: list[Job | None] = []  # None: stop after what is queued before it
        self._live: list[Job] = []  # queued or running
        self.running: Job | None = None
        self.tokens_generated = 0
        self.requests_finished = 0
        # replaced whole, never changed in place: a server on another thread may stop while
        # the engine thread runs them
        self._step_ends: tuple[Callable[[], None], ...] = ()

    # ------------------------------------------------------------------ any thread

    @property
    def num_waiting(self) -> int:
        batch = self.batch
        with self._lock:
            # a cancelled one never runs: it ends "cancelled" as it comes up
            queued = sum(isinstance(j.req, GenerateRequest) for j in self._queue
                         if j is not None and not j.cancel.is_set())
        return queued + (batch.num_waiting if batch is not None else 0)

    @property
    def num_running(self) -> int:
        batch = self.batch  # every generation runs in the batch
        return batch.num_running if batch is not None else 0

    def on_step_end(self, callback: Callable[[], None]) -> None:
        """Run `callback()` on the engine thread once the events of a step are out (each event
        of a generation running alone): a front end can hold its sinks' events until then and
        hand them over together (the server wakes its event loop once a step, not per token)."""
        self._step_ends = (*self._step_ends, callback)

    def off_step_end(self, callback: Callable[[], None]) -> None:
        """Forget a callback given to `on_step_end` (a server that stopped)."""
        self._step_ends = tuple(c for c in self._step_ends if c != callback)

    def _step_ended(self) -> None:
        for callback in self._step_ends:
            callback()

    def submit(self, req, sink: Callable[[object], None], request_id: str | None = None) -> Job:
        """Queue `req`; its events go to `sink` from the engine thread. Raises QueueFull, or
        BadRequest for an id that a queued or running request already has."""
        job = Job(req, sink, request_id)
        with self._lock:
            if request_id is not None and any(j.id == request_id for j in self._live):
                raise BadRequest(f"request id {request_id!r} is already queued or running")
            if isinstance(req, GenerateRequest):
                waiting = sum(isinstance(j.req, GenerateRequest) for j in self._live
                              if j is not self.running) - self._num_batch_running()
                if waiting >= self.max_waiting:
                    raise QueueFull(f"{waiting} requests are waiting; try again shortly")
            self._live.append(job)
            self._queue.append(job)
            self._ready.notify()
        return job

    def cancel(self, request_id: str | None = None) -> int:
        """Cancel the request with this id (None: every request); -> how many were told. A
        running one stops at its next step, a queued one as it starts (Finished "cancelled")."""
        with self._lock:
            found = [j for j in self._live if request_id is None or j.id == request_id]
        for job in found:
            job.cancel.set()
        return len(found)

    def stop(self) -> None:
        """Cancel everything and let `run` return once the running job has stopped."""
        self.cancel()
        with self._lock:
            self._queue.append(None)
            self._ready.notify()

    # ------------------------------------------------------------------ the engine thread

    def _num_batch_running(self) -> int:
        batch = self.batch
        return batch.num_running if batch is not None else 0

    def run(self) -> None:
        """The engine thread: batch steps while generations run together, otherwise one job at
        a time; every job's stream ends in a terminal event."""
        while True:
            self._step_ended()  # whatever the last turn gave out (a step, a join, a job's end)
            if self.batch is not None and self.batch.has_work:
                self._admit()
                self.batch.step()
                continue
            job = self._next()
            if job is None:
                return
            if self._batchable(job):
                self._join(job)
                continue
            if isinstance(job.req, GenerateRequest):  # no model loaded: nothing to run it on
                self._sink(job)(Failed("no model is loaded", hint="send a load command first",
                                       bad_input=True))
                continue
            self.running = job
            try:
                self.run_job(job)
            except Exception as e:  # a broken job must not take the engine down
                job.sink(Failed(f"{type(e).__name__}: {e}"))
            finally:
                self.running = None
                self._forget(job)

    def _forget(self, job: Job) -> None:
        with self._lock:
            if job in self._live:
                self._live.remove(job)

    def _batchable(self, job: Job) -> bool:
        """Every generation goes to the batch once a model is loaded."""
        return isinstance(job.req, GenerateRequest) and self.session is not None

    def _admit(self) -> None:
        """Every job at the head of the queue that can join the running batch joins it."""
        while True:
            with self._lock:
                job = self._queue[0] if self._queue else None
                if job is None or not self._batchable(job):
                    return
                self._queue.pop(0)
            self._join(job)

    def _sink(self, job: Job) -> Callable[[object], None]:
        """Where a generation's events go: counted, and the job forgotten at its end."""
        def sink(event) -> None:
            if isinstance(event, Token):
                self.tokens_generated += 1
            job.sink(event)
            if isinstance(event, Finished | Failed):
                self.requests_finished += 1
                self._forget(job)
        return sink

    def _batch(self) -> BatchRun:
        if self.batch is None:
            from engine.generate.batch_run import BatchRun

            self.batch = BatchRun(self.session, self.max_seqs, self._step_ended)
        return self.batch

    def _join(self, job: Job) -> None:
        self._batch().add(job.req, self._sink(job), job.cancel)

    def _next(self) -> Job | None:
        with self._lock:
            while not self._queue:
                self._ready.wait()
            return self._queue.pop(0)

    def run_job(self, job: Job) -> None:
        """A load or an unload, here and now (generations go through `submit`)."""
        req = job.req
        if isinstance(req, LoadRequest):
            self._load(req, job)
        elif isinstance(req, UnloadRequest):
            self.unload()
            job.sink(Finished("unloaded"))

    def _load(self, req: LoadRequest, job: Job) -> None:
        from engine.generate.session import Session
        from engine.load.loader import LoadCancelled
        from engine.parallel.session import TPSession
        from engine.plan.oom import OutOfMemory

        self.unload()
        try:
            # N > 1: this process is rank 0 and starts, supervises and ends the other ranks
            opener = TPSession if req.tensor_parallel > 1 else Session
            self.session = opener.load(req, job.sink, job.cancel)
        except BadRequest as e:
            job.sink(Failed(str(e), bad_input=True))
            return
        except LoadCancelled:
            job.sink(Finished("cancelled"))
            return
        except OutOfMemory as e:  # memory already released: the next load can succeed
            job.sink(Failed(str(e), hint=e.hint))
            return
        job.sink(self.session.loaded_event())

    def unload(self) -> None:
        if self.session is None:
            return
        from engine.load.loader import clear_memory_limit
        from engine.parallel.session import TPSession

        if isinstance(self.session, TPSession):
            self.session.close()  # its follower processes end with it
        device = self.session.lm.device
        self.session = self.batch = None
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        clear_memory_limit(device)  # a --memory-limit is its load's, not the next one's
