"""One HTTP request's choices on the engine: submitted together, their events handed from the
engine thread to the event loop (call_soon_threadsafe onto an asyncio.Queue), tagged with their
choice index. Closing it cancels whatever has not finished: a client that left frees its place.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from engine.events import Failed, Finished, Token
from engine.server.errors import APIError
from engine.server.metrics import Metrics
from engine.server.prompts import Choice
from engine.service.engine import QueueFull

RETRY_AFTER_S = 1


class Generation:
    def __init__(self, engine, choices: list[Choice], metrics: Metrics, prefix: str = "hearth"):
        self.engine, self.choices, self.metrics = engine, choices, metrics
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.queue: asyncio.Queue = asyncio.Queue()
        self.open = {c.index for c in choices}  # choices without a terminal event yet
        self._t_start = time.perf_counter()
        self._t_last: dict[int, float] = {}

    def _engine_id(self, index: int) -> str:
        return f"{self.id}-{index}"

    def start(self) -> None:
        """Submit every choice; a full queue is a 503 with Retry-After (nothing left queued)."""
        loop = asyncio.get_running_loop()
        submitted = []
        for c in self.choices:
            def sink(event, index=c.index):
                try:
                    loop.call_soon_threadsafe(self.queue.put_nowait, (index, event))
                except RuntimeError:  # the loop is gone (server stopped): nobody reads it
                    pass
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
        return index, event

    @property
    def done(self) -> bool:
        return not self.open

    def close(self) -> None:
        """Cancel every unfinished choice: running ones stop at their next step."""
        for index in self.open:
            self.engine.cancel(self._engine_id(index))

    async def watch_disconnect(self, request, interval_s: float = 0.25) -> None:
        """Cancel when the client goes away (run as a task beside the reading)."""
        while not self.done:
            if await request.is_disconnected():
                self.close()
                return
            await asyncio.sleep(interval_s)
