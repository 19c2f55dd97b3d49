"""The app's end of a remote engine: WorkerClient's signals and verbs (worker_client.py) over an
OpenAI-compatible endpoint, so the chat controller does not care where tokens come from. Each
request runs on a thread of its own through engine.remote; its events come back as queued
signals. "Loading" a remote model is asking the endpoint whether it serves it."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import ClassVar

from PySide6.QtCore import QObject, QTimer, Signal

from app.remote.endpoints import EndpointModel
from engine.events import (
    BadRequest,
    CancelRequest,
    Failed,
    Finished,
    GenerateRequest,
    Loaded,
    LoadProgress,
    PrefillProgress,
    ShutdownRequest,
    Stats,
    Token,
)
from engine.remote import CancelToken, RemoteError, check_model, parse_base_url, stream_chat

log = logging.getLogger("hearth.endpoint")
REMOTE = "remote"  # Loaded.quant and .architecture of a remote model: the endpoint's business


@dataclass(frozen=True)
class RemoteLoad:
    """Use `model` of the endpoint at `base_url`: answered by Loaded or Failed."""

    command: ClassVar[str] = "load"
    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False, compare=False)  # never in a log line


class EndpointClient(QObject):
    sig_started = Signal()
    """Never emitted: there is no process to start (WorkerClient's signal, for symmetry)."""
    sig_load_progress = Signal(object)
    """A LoadProgress event: asking the endpoint for the model."""
    sig_loaded = Signal(object)
    """A Loaded event: the endpoint serves the model."""
    sig_prefill_progress = Signal(object)
    """Never emitted: an endpoint does not report its prefill."""
    sig_token = Signal(object)
    """A Token event."""
    sig_stats = Signal(object)
    """A Stats event, measured from the stream (a few a second)."""
    sig_finished = Signal(object)
    """A Finished event: the end of an answer."""
    sig_failed = Signal(object)
    """A Failed event: the end of a load or an answer that went wrong."""
    sig_worker_died = Signal(object)
    """Never emitted: an endpoint's failures arrive as Failed events."""
    sig_stopped = Signal()
    """The client let go of the endpoint (kill() or shutdown())."""
    sig_log_line = Signal(str)
    """Never emitted (WorkerClient's signal, for symmetry)."""
    _sig_thread_event = Signal(int, object)
    """(stream id, event) from a request's thread, delivered on the GUI thread."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.busy: str | None = None  # "load" or "generate" while its stream is open
        self.ended_command: str | None = None
        self.model: EndpointModel | None = None  # the model in use, after its Loaded
        self._api_key: str | None = None
        self._pending: RemoteLoad | None = None
        self._stream_id = 0  # events of an older stream are dropped (a kill, a stop)
        self._cancel: CancelToken | None = None
        self._last_stats = Stats()
        self._signals = {LoadProgress: self.sig_load_progress, Loaded: self.sig_loaded,
                         PrefillProgress: self.sig_prefill_progress, Token: self.sig_token,
                         Stats: self.sig_stats, Finished: self.sig_finished,
                         Failed: self.sig_failed}
        self._sig_thread_event.connect(self._on_thread_event)

    @property
    def is_running(self) -> bool:
        return self.model is not None or self.busy is not None

    @property
    def pid(self) -> int:
        return 0  # nothing of this machine's to watch through NVML

    def send(self, request) -> None:
        """A RemoteLoad or a GenerateRequest (one stream at a time); cancel and shutdown at
        any moment, as for the worker."""
        if isinstance(request, CancelRequest):
            self.cancel()
            return
        if isinstance(request, ShutdownRequest):
            self.shutdown()
            return
        if self.busy is not None:
            raise RuntimeError(f"the endpoint is busy with a {self.busy}; wait or cancel it")
        if isinstance(request, RemoteLoad):
            self.model, self._pending = None, request
            self._start("load", self._load, request)
        elif isinstance(request, GenerateRequest):
            if self.model is None:
                raise RuntimeError("no remote model in use: send a RemoteLoad first")
            self._start("generate", self._generate, self.model, self._api_key, request)
        else:
            raise TypeError(f"an endpoint takes no {type(request).__name__}")

    def cancel(self) -> None:
        """Stop the answer at once: Finished("cancelled") follows, whatever the endpoint does
        (a stalled one included); what it sends after is dropped."""
        if self.busy != "generate":
            return
        self._cancel.cancel()
        self._stream_id += 1
        stream_id, stats = self._stream_id, self._last_stats
        # queued, as the worker's answer would be: stop() returns before its Finished
        QTimer.singleShot(0, self, lambda: self._on_thread_event(
            stream_id, Finished("cancelled", stats)))

    def kill(self) -> None:
        """Let go of the endpoint and any open stream; sig_stopped follows."""
        if self._cancel is not None:
            self._cancel.cancel()
        self._stream_id += 1
        had_something = self.is_running
        self.busy, self.model, self._api_key, self._pending = None, None, None, None
        if had_something:
            self.sig_stopped.emit()

    def shutdown(self, _timeout_ms: int = 0) -> None:
        self.kill()

    # ------------------------------------------------------------------ threads

    def _start(self, command: str, target, *args) -> None:
        self.busy = command
        self._stream_id += 1
        self._cancel = CancelToken()
        self._last_stats = Stats()
        thread = threading.Thread(target=target, args=(self._stream_id, self._cancel, *args),
                                  name=f"hearth-endpoint-{command}", daemon=True)
        thread.start()

    def _load(self, stream_id: int, _cancel: CancelToken, request: RemoteLoad) -> None:
        try:
            where = parse_base_url(request.base_url).where
            log.info("asking the endpoint at %s for %s", where, request.model)
            self._post(stream_id, LoadProgress("connecting", 0, 1, f"asking {where} for "
                                               f"{request.model}"))
            found = check_model(request.base_url, request.model, request.api_key)
            event = Loaded(model=request.model, architecture=REMOTE, device=where, quant=REMOTE,
                           kv_dtype=REMOTE, context=found.context, weights_bytes=0,
                           kv_cache_bytes=0, notes=(f"runs on {where}",))
        except RemoteError as e:
            event = e.failed()
        except BadRequest as e:
            event = Failed(str(e), bad_input=True)
        self._post(stream_id, event)

    def _generate(self, stream_id: int, cancel: CancelToken, model: EndpointModel,
                  api_key: str | None, request: GenerateRequest) -> None:
        for event in stream_chat(model.base_url, model.model, request, api_key=api_key,
                                 cancel=cancel):
            self._post(stream_id, event)

    def _post(self, stream_id: int, event) -> None:
        try:
            self._sig_thread_event.emit(stream_id, event)
        except RuntimeError:  # the client was deleted with its window: nobody is listening
            pass

    # ------------------------------------------------------------------ GUI thread

    def _on_thread_event(self, stream_id: int, event) -> None:
        if stream_id != self._stream_id:
            return
        if isinstance(event, Loaded) and self._pending is not None:
            pending, self._pending = self._pending, None
            self.model = EndpointModel(pending.base_url, pending.model, event.context)
            self._api_key = pending.api_key
        if isinstance(event, Stats):
            self._last_stats = event
        if isinstance(event, (Loaded, Finished, Failed)):
            # before emitting: a handler may send the next request
            self.ended_command, self.busy = self.busy, None
            if isinstance(event, Failed) and self.ended_command == "load":
                self._pending = None
        self._signals[type(event)].emit(event)
