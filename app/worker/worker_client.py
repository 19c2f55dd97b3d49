"""The app's end of the worker process: requests out as JSON lines, events back as Qt signals.

It owns the QProcess and the one-stream-at-a-time rule, nothing else: what a conversation does
with the events lives in chat_controller.py. Each generate and cancel it sends carries an id of
its own; events tagged with an id it did not send (or no longer waits on) are ignored. The
worker's server (serve, serve_stop) runs beside that one stream, and its events have signals of
their own.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import sys
from collections import deque

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

from app.paths import REPO_ROOT
from app.worker.worker_lines import JsonLineReader, WorkerDied, parse_event
from engine.events import (
    CancelRequest,
    Failed,
    Finished,
    GenerateRequest,
    Loaded,
    LoadProgress,
    PrefillProgress,
    ServeRequest,
    ServerStats,
    ServerStopped,
    ServeStopRequest,
    Serving,
    ShutdownRequest,
    Stats,
    Token,
    request_to_json,
)
from engine.platform.child_env import NO_MULTICAST

__all__ = ["JsonLineReader", "WorkerClient", "WorkerDied"]

log = logging.getLogger("hearth.worker")

DEFAULT_COMMAND = (sys.executable, "-m", "engine.cli.worker")
SHUTDOWN_TIMEOUT_MS = 3000
NUM_STDERR_LINES_KEPT = 40
# workers let go with a server that outlives the window (release()): their QProcess must never
# be destroyed, which would kill them; the app leaves by os._exit while this is not empty
RELEASED: list[QProcess] = []
_ids = itertools.count(1)  # one sequence for every client: no two requests share an id


class WorkerClient(QObject):
    """Starts `python -m engine.cli.worker` (or `command`), writes requests, re-emits its
    events."""

    sig_started = Signal()
    """The worker process is running."""
    sig_load_progress = Signal(object)
    """A LoadProgress event."""
    sig_loaded = Signal(object)
    """A Loaded event: the end of a successful load."""
    sig_prefill_progress = Signal(object)
    """A PrefillProgress event."""
    sig_token = Signal(object)
    """A Token event."""
    sig_stats = Signal(object)
    """A Stats event (a few a second while generating)."""
    sig_finished = Signal(object)
    """A Finished event: the end of a generation."""
    sig_failed = Signal(object)
    """A Failed event: the end of a load or a generation that went wrong."""
    sig_worker_died = Signal(object)
    """A WorkerDied: the process ended without being asked to; start() makes a new one."""
    sig_stopped = Signal()
    """The process ended because it was asked to (shutdown() or kill())."""
    sig_log_line = Signal(str)
    """One line the worker wrote on stderr."""
    sig_serving = Signal(object)
    """A Serving event: the worker's server listens at its url."""
    sig_server_stats = Signal(object)
    """A ServerStats event (about once a second while serving)."""
    sig_server_stopped = Signal(object)
    """A ServerStopped: the worker's server ended (asked to, or its worker did)."""
    sig_server_failed = Signal(object)
    """A Failed event answering a serve command (the port in use, say)."""

    def __init__(self, command: tuple[str, ...] | list[str] | None = None,
                 env: dict[str, str] | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.command = tuple(command or DEFAULT_COMMAND)
        self.extra_env = dict(env or {})
        self.busy: str | None = None  # the command whose stream is open: "load", "generate"...
        self.ended_command: str | None = None  # the command the last terminal event ended
        self._process: QProcess | None = None
        self._stdout = JsonLineReader()
        self._stderr = JsonLineReader()
        self._stderr_tail: deque[str] = deque(maxlen=NUM_STDERR_LINES_KEPT)
        self._unsent: list[str] = []  # lines written before the process had started
        self._is_exit_expected = False
        self.generate_id: str | None = None  # the id of the generation this client waits on
        self.serve_id: str | None = None  # of the last serve command
        self.server_url = ""  # while the worker's server listens
        self._signals = {
            LoadProgress: self.sig_load_progress,
            Loaded: self.sig_loaded,
            PrefillProgress: self.sig_prefill_progress,
            Token: self.sig_token,
            Stats: self.sig_stats,
            Finished: self.sig_finished,
            Failed: self.sig_failed,
            Serving: self.sig_serving,
            ServerStats: self.sig_server_stats,
            ServerStopped: self.sig_server_stopped,
        }

    # ------------------------------------------------------------------ process

    @property
    def is_running(self) -> bool:
        return self._process is not None

    @property
    def pid(self) -> int:
        return int(self._process.processId()) if self._process is not None else 0

    def start(self) -> None:
        """Start a worker process unless one is running; requests sent meanwhile are queued."""
        if self._process is not None:
            return
        process = QProcess(self)
        env = QProcessEnvironment.systemEnvironment()
        # the child finds `engine` whatever the current folder is
        path = os.pathsep.join(p for p in (str(REPO_ROOT), env.value("PYTHONPATH", "")) if p)
        env.insert("PYTHONPATH", path)
        env.insert("PYTHONUNBUFFERED", "1")
        for key, value in {**self.extra_env, **NO_MULTICAST}.items():  # multicast off, always
            env.insert(key, value)
        process.setProcessEnvironment(env)
        process.setProgram(self.command[0])
        process.setArguments(list(self.command[1:]))
        process.started.connect(self._on_process_started)
        process.readyReadStandardOutput.connect(self._on_process_ready_read_stdout)
        process.readyReadStandardError.connect(self._on_process_ready_read_stderr)
        process.finished.connect(self._on_process_finished)
        process.errorOccurred.connect(self._on_process_error_occurred)
        self._process = process
        self._stdout, self._stderr = JsonLineReader(), JsonLineReader()
        self._stderr_tail.clear()
        self._is_exit_expected = False
        log.info("starting worker: %s", " ".join(self.command))
        process.start()

    def send(self, request) -> None:
        """Write one request; starts the worker if needed.

        Load, generate and unload each open a stream that ends in one terminal event; one
        stream at a time. Cancel, shutdown, serve and serve_stop may be sent at any moment.
        """
        if isinstance(request, GenerateRequest) and request.id is None:
            request = dataclasses.replace(request, id=f"chat-{next(_ids)}")
        if isinstance(request, ServeRequest) and request.id is None:
            request = dataclasses.replace(request, id=f"serve-{next(_ids)}")
        if not isinstance(request, (CancelRequest, ShutdownRequest, ServeRequest,
                                    ServeStopRequest)):
            if self.busy is not None:
                raise RuntimeError(f"the worker is busy with a {self.busy}; wait or cancel it")
            self.busy = request.command
            self.generate_id = request.id if isinstance(request, GenerateRequest) else None
        if isinstance(request, ServeRequest):
            self.serve_id = request.id
        self.start()
        line = request_to_json(request)
        if self._process.state() == QProcess.ProcessState.Running:
            self._process.write((line + "\n").encode("utf-8"))
        else:
            self._unsent.append(line)

    def cancel(self) -> None:
        """Ask the running generation to stop; it ends in Finished(reason="cancelled")."""
        if self.busy == "generate":
            self.send(CancelRequest(id=self.generate_id))

    def release(self) -> None:
        """Let the worker serve on without this window (a server started with keep): its stdin
        closes, and the process is this client's no more. A later start() makes a new one."""
        process, self._process = self._process, None
        if process is None:
            return
        process.disconnect(self)  # nothing it says reaches this client any more
        if process.state() == QProcess.ProcessState.Running:
            process.write((request_to_json(ShutdownRequest()) + "\n").encode("utf-8"))
        process.closeWriteChannel()
        process.setParent(None)
        RELEASED.append(process)
        self.busy = None
        self._unsent.clear()
        self._server_ended("")
        self.sig_stopped.emit()

    def shutdown(self, timeout_ms: int = SHUTDOWN_TIMEOUT_MS) -> None:
        """Ask the worker to exit; kill it if it has not after `timeout_ms`. Never blocks."""
        if self._process is None:
            return
        self._is_exit_expected = True
        if self._process.state() != QProcess.ProcessState.Running:
            self._process.kill()  # still starting: nothing to end gracefully
            return
        self._process.write((request_to_json(ShutdownRequest()) + "\n").encode("utf-8"))
        self._process.closeWriteChannel()  # EOF on stdin: the worker leaves even if it missed it
        process = self._process
        QTimer.singleShot(timeout_ms, self, lambda: self._kill_if_still(process))

    def kill(self) -> None:
        """End the worker at once (cancelling a load, say); no sig_worker_died follows.

        The client forgets the process at once, so start() may follow immediately.
        """
        process, self._process = self._process, None
        if process is None:
            return
        process.kill()
        process.waitForFinished(2000)  # SIGKILL: reaped within milliseconds
        process.deleteLater()
        self.busy = None
        self._unsent.clear()
        self._server_ended("the engine process was ended")
        self.sig_stopped.emit()

    def _server_ended(self, error: str) -> None:
        if self.server_url:
            self.server_url = ""
            self.sig_server_stopped.emit(ServerStopped(error))

    def _kill_if_still(self, process: QProcess) -> None:
        if self._process is process:
            log.warning("worker did not exit within the timeout; killing it")
            process.kill()

    # ------------------------------------------------------------------ slots

    def _on_process_started(self) -> None:
        if not self._is_current(self.sender()):
            return  # kill() let it go while it started (its waitForFinished emits `started`)
        unsent, self._unsent = self._unsent, []
        for line in unsent:
            self._process.write((line + "\n").encode("utf-8"))
        self.sig_started.emit()

    def _on_process_ready_read_stdout(self) -> None:
        if self._is_current(self.sender()):
            self._dispatch(self._stdout.feed(bytes(self._process.readAllStandardOutput())))

    def _on_process_ready_read_stderr(self) -> None:
        if self._is_current(self.sender()):
            self._log(self._stderr.feed(bytes(self._process.readAllStandardError())))

    def _on_process_finished(self, exit_code: int, exit_status: QProcess.ExitStatus) -> None:
        process = self._process
        if not self._is_current(self.sender()):
            return
        self._dispatch(self._stdout.feed(bytes(process.readAllStandardOutput())))
        self._dispatch(self._stdout.flush())
        self._log(self._stderr.feed(bytes(process.readAllStandardError())) + self._stderr.flush())
        self._end(exit_code, exit_status == QProcess.ExitStatus.CrashExit, "")

    def _on_process_error_occurred(self, error: QProcess.ProcessError) -> None:
        # every other error is followed by `finished`, which reports it
        if error == QProcess.ProcessError.FailedToStart and self._is_current(self.sender()):
            detail = f"could not start the engine ({' '.join(self.command)}): "
            self._end(-1, False, detail + self._process.errorString())

    def _is_current(self, process) -> bool:
        """False for a process that kill() already let go of."""
        return process is not None and process is self._process

    def _end(self, exit_code: int, was_signalled: bool, message: str) -> None:
        process, self._process = self._process, None
        process.deleteLater()
        command, self.busy = self.busy, None
        self._unsent.clear()
        self._server_ended("the engine process ended")
        log.info("worker ended (exit code %s, signalled: %s)", exit_code, was_signalled)
        if self._is_exit_expected:
            self.sig_stopped.emit()
            return
        if not message:
            during = f" while running a {command}" if command else ""
            how = "was killed" if was_signalled else f"exited with code {exit_code}"
            message = f"The engine process {how}{during}."
        self.sig_worker_died.emit(WorkerDied(
            exit_code=exit_code, was_signalled=was_signalled, command=command,
            stderr_tail="\n".join(self._stderr_tail), message=message,
        ))

    def _dispatch(self, lines: list[str]) -> None:
        for line in lines:
            try:
                event, request_id = parse_event(line)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                # a library printing on stdout must not break the stream: log and go on
                log.warning("ignoring a worker stdout line that is not an event (%s): %.200s",
                            e, line)
                continue
            if request_id is not None and request_id == self.serve_id:
                if isinstance(event, Failed):
                    self.sig_server_failed.emit(event)
                continue
            if request_id is not None and request_id != self.generate_id:
                continue  # another client's, or a generation this client stopped waiting on
            if isinstance(event, Serving):
                self.server_url = event.url
            elif isinstance(event, ServerStopped):
                self.server_url = ""
            elif isinstance(event, (Loaded, Finished, Failed)):
                # before emitting: a handler may send the next request
                self.ended_command, self.busy = self.busy, None
                self.generate_id = None
            self._signals[type(event)].emit(event)

    def _log(self, lines: list[str]) -> None:
        for line in lines:
            self._stderr_tail.append(line)
            log.info("%s", line)
            self.sig_log_line.emit(line)
