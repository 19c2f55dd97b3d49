"""engine/server's HTTP app run in a thread of the worker process on the worker's own Engine, so
the window's chat and HTTP clients queue on one model; `server_stats` about once a second.
"""

from __future__ import annotations

import threading
import time

from engine.events import BadRequest, ServeRequest, ServerStats, Serving

STATS_INTERVAL_S = 1.0  # coarse: the app re-emits each as a Qt signal
START_TIMEOUT_S = 30.0  # the first import of the web stack on a busy machine
STOP_TIMEOUT_S = 10.0  # uvicorn's graceful shutdown (runner.SHUTDOWN_GRACE_S) and a margin


class ServeFailed(Exception):
    """The server could not start: one sentence for the user."""

    def __init__(self, message: str, hint: str = "", bad_input: bool = False):
        super().__init__(message)
        self.hint, self.bad_input = hint, bad_input


class WorkerServer:
    def __init__(self, engine, req: ServeRequest, emit):
        self.engine, self.req, self.emit = engine, req, emit
        self.keep = req.keep
        self.url = ""
        self.port = 0
        self._server = None  # the uvicorn.Server
        self._thread: threading.Thread | None = None
        self._sock = None
        self._stopped = threading.Event()

    def start(self) -> None:
        """Bind, start uvicorn in a thread, emit `serving` once it listens; raises ServeFailed.
        The server answers for the model loaded now (its tokenizer, context and name)."""
        try:
            from engine.server.app import Settings, create_app
            from engine.server.model_view import ModelView
            from engine.server.runner import bind, make_server, url_host
        except ImportError as e:
            raise ServeFailed(f"the server needs packages that are not installed ({e.name})",
                              hint="pip install 'hearth[server]'") from None
        session = self.engine.session
        if session is None:
            raise ServeFailed("no model is loaded to serve", hint="load a model first",
                              bad_input=True)
        try:
            sock = bind(self.req.host, self.req.port)
        except BadRequest as e:
            raise ServeFailed(str(e), bad_input=True) from None
        port = sock.getsockname()[1]
        settings = Settings(host=self.req.host, port=port, api_key=self.req.api_key,
                            cors_origins=self.req.cors_origins)
        app = create_app(self.engine, ModelView.of(session, None), settings)
        # not runner.BackgroundServer: its stop cancels every request, the window's chat too;
        # here a stop ends the server's connections and so only its clients' requests
        self._server = server = make_server(app, self.engine, announce=False)
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                        name="hearth-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.ready.wait(0.05):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                sock.close()
                raise ServeFailed("the server did not start; the worker's log says why")
        self._sock, self.port = sock, port
        self.url = f"http://{url_host(self.req.host.strip('[]'))}:{port}/v1"
        self.emit(Serving(self.url))
        threading.Thread(target=self._report, name="hearth-server-stats", daemon=True).start()

    def stop(self) -> None:
        """Stop listening and end open connections (their generations are cancelled)."""
        self._stopped.set()
        if self._server is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout=STOP_TIMEOUT_S)
        if self._thread.is_alive():  # a stream that would not end: close it
            self._server.force_exit = True
            self._thread.join(timeout=STOP_TIMEOUT_S)
        self._sock.close()

    def stats(self, tokens_per_s: float = 0.0) -> ServerStats:
        connections = self._server.server_state.connections if self._server else ()
        return ServerStats(url=self.url, num_clients=len(connections),
                           num_running=self.engine.num_running,
                           num_waiting=self.engine.num_waiting, tokens_per_s=tokens_per_s)

    def _report(self) -> None:
        last_tokens, last_t = self.engine.tokens_generated, time.monotonic()
        while not self._stopped.wait(STATS_INTERVAL_S):
            tokens, t = self.engine.tokens_generated, time.monotonic()
            rate = (tokens - last_tokens) / max(t - last_t, 1e-6)
            last_tokens, last_t = tokens, t
            self.emit(self.stats(round(rate, 1)))
