"""The engine process the app drives: JSON-line commands on stdin, events on stdout, over one
`Engine` (engine/service/engine.py) that the window's chat and the worker's own HTTP server share.

The main thread reads commands, so a cancel lands while the engine thread generates (between two
steps) or loads (between two stages). Every line that is not a cancel or a shutdown, whatever it
holds, ends in one terminal event (a bad one in `Failed(bad_input=True)`) and the worker stays
alive. stdout carries events only: anything else printed goes to stderr.

Request ids: a generate may carry an `id`; every event line of that request then carries the same
`"id"` (added here as the line is written, not an event field), its Failed too, even a bad line's
where the id itself could be read. Several generates may be queued; they run in arrival order,
each to its own Finished or Failed. `cancel` with an id stops that request (queued or running);
without one, everything. A load or unload waits for the generations queued before it; those
queued after it run on what it leaves loaded. Load events carry no id.

The server: `serve` starts engine/server's app in a thread of this process on the same Engine
(worker_server.py): `serving` {url} once it listens, or a Failed tagged with the serve command's
id; `server_stats` about once a second; `serve_stop` ends it (`server_stopped`). When stdin closes
or a shutdown comes (the window quit), the server stops with the worker, unless it was started
with `keep`: then stdout goes quiet and it serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
from collections.abc import Iterable, Iterator

from engine.events import (
    BadRequest,
    CancelRequest,
    Failed,
    GenerateRequest,
    Loaded,
    ServeRequest,
    ServerStopped,
    ServeStopRequest,
    ShutdownRequest,
    event_to_json,
    request_from_json,
)
from engine.events.requests import check_request_id
from engine.service.engine import Engine, Job, QueueFull

MAX_COMMAND_BYTES = 64 * 2**20  # a 1M-token conversation is a few MB; past this, not a command
JOIN_TIMEOUT_S = 1.0


def command_lines(stream, max_bytes: int = MAX_COMMAND_BYTES) -> Iterator[bytes | None]:
    """A binary stream's lines, undecoded (request_from_json answers invalid UTF-8, where a text
    stream would end the loop); a line longer than `max_bytes` comes as None, its rest skipped."""
    while line := stream.readline(max_bytes + 1):
        if len(line) > max_bytes and not line.endswith(b"\n"):
            while (rest := stream.readline(max_bytes)) and not rest.endswith(b"\n"):
                pass
            yield None
        else:
            yield line


class WorkerEngine(Engine):
    def close(self) -> None:
        """Let `run` return once what is queued now has run (stop() cancels it first)."""
        with self._lock:
            self._queue.append(None)
            self._ready.notify()


class _QueueEnd:
    """`jobs.put(None)` then `run_jobs()`: run what is queued, then return (tests feed lines so)."""

    def __init__(self, engine: WorkerEngine) -> None:
        self.engine = engine

    def put(self, item: None) -> None:
        if item is not None:
            raise TypeError("commands are queued through Worker.command")
        self.engine.close()


class _Discard:
    def write(self, _text: str) -> None:
        pass

    def flush(self) -> None:
        pass


class Worker:
    def __init__(self, out, engine: WorkerEngine | None = None):
        self.out = out
        self.lock = threading.Lock()  # one line at a time on stdout, from any thread
        self.engine = engine or WorkerEngine()
        self.jobs = _QueueEnd(self.engine)
        self.server = None  # a worker_server.WorkerServer while serving

    @property
    def session(self):
        return self.engine.session

    @session.setter
    def session(self, session) -> None:
        self.engine.session = session

    def emit(self, event, request_id: str | None = None) -> None:
        line = event_to_json(event)
        if request_id is not None:  # last, so a line still starts with its event's name
            line = line[:-1] + ', "id": ' + json.dumps(request_id) + "}"
        with self.lock:
            try:
                self.out.write(line + "\n")
                self.out.flush()
            except (BrokenPipeError, ValueError):  # the reader is gone: nobody left to tell
                self.out = _Discard()

    def read_commands(self, lines: Iterable[str | bytes | None], wait_for_signal=None) -> None:
        """Main thread: answer each line (see `command`); at shutdown or the end of stdin, stop
        what runs (a kept server first serves on, see `leave`) and leave."""
        for line in lines:
            if not self.command(line):
                break
        self.leave(wait_for_signal)

    def leave(self, wait_for_signal=None) -> None:
        """The window is gone. A server started with `keep` serves on, silently, until
        `wait_for_signal()` returns (main(): SIGTERM or SIGINT); then everything stops."""
        server = self.server
        if server is not None and server.keep and wait_for_signal is not None:
            with self.lock:
                self.out = _Discard()
            wait_for_signal()
        self._stop_server()
        self.engine.stop()

    def command(self, line: str | bytes | None) -> bool:
        """Parse and check one line, answer cancel at once, queue the rest for the engine thread;
        False for shutdown. None is a line too long to read (command_lines)."""
        if line is None:
            self.emit(Failed(f"command is longer than {MAX_COMMAND_BYTES // 2**20} MiB",
                             bad_input=True))
            return True
        if not line.strip():
            return True
        try:
            req = request_from_json(line)
            if hasattr(req, "validate"):
                req.validate()  # before the queue: a wrong field fails at once, model or not
        except BadRequest as e:
            self.emit(Failed(str(e), bad_input=True), _id_of(line))
            return True
        except Exception as e:  # a line must never end the reading loop, whatever it holds
            self.emit(Failed(f"cannot read the command: {type(e).__name__}", bad_input=True))
            return True
        if isinstance(req, CancelRequest):
            self.engine.cancel(req.id)  # an id nothing has: nothing to stop, nothing to say
        elif isinstance(req, ShutdownRequest):
            return False
        elif isinstance(req, ServeRequest):
            self._serve(req)
        elif isinstance(req, ServeStopRequest):
            threading.Thread(target=self._stop_server, name="hearth-server-stop",
                             daemon=True).start()
        else:
            self._submit(req)
        return True

    def _submit(self, req) -> None:
        rid = req.id if isinstance(req, GenerateRequest) else None

        def sink(event) -> None:
            self.emit(event, rid)
            if isinstance(event, Loaded) and self.server is not None:
                # the server names and tokenizes for one model: it starts anew on the new one
                threading.Thread(target=self._restart_server, daemon=True).start()

        try:
            self.engine.submit(req, sink, rid)
        except BadRequest as e:  # an id already queued or running
            self.emit(Failed(str(e), bad_input=True), rid)
        except QueueFull as e:
            self.emit(Failed(str(e), hint="wait for a generation to end"), rid)

    def _serve(self, req: ServeRequest) -> None:
        from engine.cli.worker_server import WorkerServer

        with self.lock:
            running = self.server
            if running is None:
                self.server = WorkerServer(self.engine, req, self.emit)
        if running is not None:
            where = f"running at {running.url}" if running.url else "starting"
            self.emit(Failed(f"the server is already {where}; stop it first", bad_input=True),
                      req.id)
            return
        # binding and importing the web stack take a moment: cancels must not wait for it
        threading.Thread(target=self._start_server, args=(self.server, req), daemon=True,
                         name="hearth-server-start").start()

    def _start_server(self, server, req: ServeRequest) -> None:
        from engine.cli.worker_server import ServeFailed

        try:
            server.start()  # emits `serving` once it listens
        except ServeFailed as e:
            with self.lock:
                if self.server is server:
                    self.server = None
            self.emit(Failed(str(e), hint=e.hint, bad_input=e.bad_input), req.id)

    def _restart_server(self) -> None:
        from engine.cli.worker_server import WorkerServer

        with self.lock:
            old = self.server
        if old is None or not old.url:
            return
        old.stop()
        req = dataclasses.replace(old.req, port=old.port)  # the address its clients know
        with self.lock:
            self.server = WorkerServer(self.engine, req, self.emit)
        self._start_server(self.server, req)

    def _stop_server(self) -> None:
        with self.lock:
            server, self.server = self.server, None
        if server is not None:
            server.stop()
            self.emit(ServerStopped())

    def run_jobs(self) -> None:
        """Engine thread: one job at a time; every job's stream ends in a terminal event."""
        self.engine.run()

    def _run(self, req, cancel: threading.Event) -> None:
        """Run one load, unload or generate here and now, its events on stdout (no id)."""
        self.engine.run_job(Job(req, self.emit, None, cancel))

    def _unload(self) -> None:
        self.engine.unload()


def _id_of(line: str | bytes) -> str | None:
    """The id of a command that failed its checks, where one can be read: its Failed is tagged
    with it, so the client waiting on that id hears the answer."""
    try:
        obj = json.loads(line)
        request_id = obj.get("id") if isinstance(obj, dict) else None
        if isinstance(request_id, str):
            check_request_id(request_id)
            return request_id
    except (ValueError, RecursionError, BadRequest):
        pass
    return None


def _until_sigterm_or_sigint() -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):  # a timeout: signal handlers run between waits on every platform
        pass


def _quiet_std_streams() -> None:
    """Nobody reads the pipes once the window is gone: a full or closed pipe must not stall or
    end a kept server (uvicorn and libraries still write to stderr)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)


def main() -> int:
    out = sys.stdout
    sys.stdout = sys.stderr  # library prints must never corrupt the event stream
    worker = Worker(out)
    engine = threading.Thread(target=worker.run_jobs, name="hearth-engine", daemon=True)
    engine.start()

    def serve_on() -> None:
        _quiet_std_streams()
        _until_sigterm_or_sigint()

    worker.read_commands(command_lines(sys.stdin.buffer), wait_for_signal=serve_on)
    # the job was cancelled and stops at its next step; one stuck in a single C operation (a
    # template's huge `**`) must not keep the process alive after the app let go of it
    engine.join(timeout=JOIN_TIMEOUT_S)
    worker._unload()  # tensor-parallel followers end here rather than notice rank 0 is gone
    return 0


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown of torch and its threads (a second or more on a
    loaded CPU): the app waits on this exit, and nothing is left to write."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
