"""One HTTP request's choices on the engine: submitted together, their events handed from the
engine thread to the event loop through the app's Mailbox onto a bounded Output queue, tagged with
their choice index. Closing it cancels whatever has not finished: a client that left frees its
place. The engine thread never waits on a client: its events are appended and it goes on.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable

from engine.events import Failed, Finished, Token
from engine.server.errors import APIError
from engine.server.metrics import Metrics
from engine.server.prompts import Choice
from engine.service.engine import QueueFull

RETRY_AFTER_S = 1
WAKER_POLL_S = 1.0  # how soon the mailbox's thread notices that its loop has closed
# events a choice may have waiting for its client; a reader that keeps up holds one step's
BUFFERED_PER_CHOICE = 1024
CLIENT_LEFT = "the client closed the request before its answer was done"


class Output(asyncio.Queue):
    """A generation's (choice index, event) pairs on the event loop, at most `bound` of them
    waiting. Past the bound the client reads too slowly: `on_overflow()` runs once and later
    events are dropped, but for the terminal ones, so the answer still ends."""

    def __init__(self, bound: int, on_overflow: Callable[[], None]):
        super().__init__()
        self.bound, self.on_overflow = bound, on_overflow
        self.has_overflowed = False

    def put_nowait(self, item) -> None:
        if self.qsize() >= self.bound and not isinstance(item[1], (Finished, Failed)):
            if not self.has_overflowed:
                self.has_overflowed = True
                self.on_overflow()
            return
        super().put_nowait(item)


class Mailbox:
    """Every generation's events, from the engine thread to the event loop, with one wakeup for
    all that one engine step gave out. A wakeup is a self-pipe write, which lets the GIL go: one
    per token lets the loop take it from the engine thread again and again within a step (the
    GPU idles meanwhile). An engine with `on_step_end` rings the bell once a step, and a thread
    of the mailbox's own wakes the loop as soon as the engine thread waits (on the GPU)."""

    def __init__(self, engine=None):
        self._items: deque = deque()
        self._woken = False  # a drain is due and has not started yet
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bell: queue.SimpleQueue = queue.SimpleQueue()  # put() keeps the GIL
        self._waker: threading.Thread | None = None
        self._engine = engine
        self._deferred = hasattr(engine, "on_step_end")  # else each event rings (a stand-in)
        if self._deferred:
            engine.on_step_end(self.flush)

    def close(self) -> None:
        """The server stopped: the engine no longer rings this mailbox's bell."""
        if self._deferred:
            self._engine.off_step_end(self.flush)

    def bind(self) -> None:
        if self._waker is None:
            self._loop = asyncio.get_running_loop()
            self._waker = threading.Thread(target=self._wake_loop, name="hearth-mailbox",
                                           daemon=True)
            self._waker.start()

    def post(self, inbox: asyncio.Queue, item) -> None:
        """On the engine thread (or whichever thread the engine gives events on)."""
        self._items.append((inbox, item))
        if not self._deferred:
            self.flush()

    def flush(self) -> None:
        if not self._woken and self._items:
            self._woken = True
            self._bell.put(True)

    def _wake_loop(self) -> None:
        while not self._loop.is_closed():
            try:
                self._bell.get(timeout=WAKER_POLL_S)
            except queue.Empty:
                continue
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is gone (server stopped): nobody reads it
                return

    def _drain(self) -> None:
        # cleared before popping: an item posted after the last pop rings again
        self._woken = False
        items = self._items
        while items:
            inbox, item = items.popleft()
            inbox.put_nowait(item)


class ServedGeneration:
    def __init__(self, engine, choices: list[Choice], metrics: Metrics, prefix: str = "hearth",
                 mailbox: Mailbox | None = None):
        self.engine, self.choices, self.metrics = engine, choices, metrics
        self.mailbox = mailbox or Mailbox()
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.queue = Output(BUFFERED_PER_CHOICE * len(choices), self._overflowed)
        self.open = {c.index for c in choices}  # choices without a terminal event yet
        self.ended_why: APIError | None = None  # why the server cancelled it, where it did
        self.reasons: dict[int, str] = {}  # each ended choice's Finished reason ("stop_string")
        self._t_start = time.perf_counter()
        self._t_last: dict[int, float] = {}

    def _engine_id(self, index: int) -> str:
        return f"{self.id}-{index}"

    def start(self) -> None:
        """Submit every choice; a full queue is a 503 with Retry-After (nothing left queued)."""
        self.mailbox.bind()
        post, inbox = self.mailbox.post, self.queue
        submitted = []
        for c in self.choices:
            def sink(event, index=c.index):
                post(inbox, (index, event))
            try:
                self.engine.submit(c.request, sink, self._engine_id(c.index))
            except QueueFull as e:
                for index in submitted:
                    self.engine.cancel(self._engine_id(index))
                raise APIError(503, f"the server is busy: {e}", None, "queue_full",
                               {"Retry-After": str(RETRY_AFTER_S)}) from None
            submitted.append(c.index)

    async def next(self) -> tuple[int, object]:
        """The next (choice index, event); the caller stops once `done`."""
        index, event = await self.queue.get()
        if isinstance(event, Token):
            now = time.perf_counter()
            last = self._t_last.get(index)
            if last is None:
                self.metrics.ttft_s.observe(now - self._t_start)
            else:
                self.metrics.inter_token_s.observe(now - last)
            self._t_last[index] = now
        elif isinstance(event, (Finished, Failed)):
            self.open.discard(index)
            if isinstance(event, Finished):
                self.reasons[index] = event.reason
        return index, event

    @property
    def done(self) -> bool:
        return not self.open

    def close(self) -> None:
        """Cancel every unfinished choice: running ones stop at their next step."""
        for index in self.open:
            self.engine.cancel(self._engine_id(index))

    def _overflowed(self) -> None:
        self.metrics.overflows.inc()
        self.ended_why = APIError(503, f"the client read the answer too slowly: more than "
                                  f"{self.queue.bound:,} events waited for it; the request was "
                                  "cancelled", code="client_too_slow")
        self.close()

    async def watch_disconnect(self, request, interval_s: float = 0.25) -> None:
        """Cancel when the client goes away (run as a task beside the reading)."""
        while not self.done:
            if await request.is_disconnected():
                # its own status (nginx's 499), not a stop's 503, in /metrics
                self.ended_why = self.ended_why or APIError(499, CLIENT_LEFT,
                                                            code="client_closed")
                self.close()
                return
            await asyncio.sleep(interval_s)
