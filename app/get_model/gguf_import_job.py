"""One GGUF import at a time, as a child process (`hearth import FILE --json`, through QProcess,
so the window never waits on torch): its stages re-emitted as progress, a cancel that kills it
and removes what it had half written, and one sentence when it fails."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, Signal

from app.paths import REPO_ROOT
from app.worker.worker_client import JsonLineReader
from engine.files.model_home import models_dir

log = logging.getLogger("hearth.import")
# engine/cli/cli.py runs as a module: the same Python as the app, whatever is on PATH
DEFAULT_COMMAND = (sys.executable, "-m", "engine.cli.cli")
WORK_GLOB = ".*.importing-*"  # engine.files.gguf_import writes here, then renames into place
NUM_STDERR_LINES_KEPT = 20
KILL_WAIT_MS = 3000


@dataclass(frozen=True)
class ImportProgress:
    stage: str
    done: int
    total: int


@dataclass(frozen=True)
class ImportResult:
    folder: Path  # the new model folder, listed among the imported models
    weights_bytes: int  # its 16-bit safetensors
    gguf_bytes: int | None  # the file it came from

    @property
    def growth(self) -> float | None:
        """How many times the GGUF's size the 16-bit weights take."""
        return self.weights_bytes / self.gguf_bytes if self.gguf_bytes else None


class GGUFImportJob(QObject):
    sig_progress = Signal(object)
    """An ImportProgress, once per stage of the import."""
    sig_imported = Signal(object)
    """An ImportResult: the import finished and its folder is in place."""
    sig_failed = Signal(str)
    """One sentence: why the import stopped (the child's own `hearth: ...` line)."""
    sig_cancelled = Signal()
    """The import was cancelled; its process is gone and nothing of it is left."""
    sig_busy_changed = Signal(bool)
    """An import started (True) or ended, whichever way (False)."""

    def __init__(self, command: tuple[str, ...] | list[str] | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.command = tuple(command or DEFAULT_COMMAND)  # `import FILE --json` is appended
        self.source: Path | None = None  # the file being imported
        self.progress: ImportProgress | None = None
        self._process: QProcess | None = None
        self._stdout, self._stderr = JsonLineReader(), JsonLineReader()
        self._stderr_tail: deque[str] = deque(maxlen=NUM_STDERR_LINES_KEPT)
        self._result: ImportResult | None = None
        self._work_before: set[Path] = set()

    @property
    def is_busy(self) -> bool:
        return self._process is not None

    @property
    def pid(self) -> int:
        return int(self._process.processId()) if self._process is not None else 0

    def start(self, path: Path) -> None:
        """Import one GGUF file; sig_imported, sig_failed or sig_cancelled follows."""
        if self._process is not None:
            return
        self.source, self.progress, self._result = Path(path), None, None
        self._stdout, self._stderr = JsonLineReader(), JsonLineReader()
        self._stderr_tail.clear()
        self._work_before = _work_folders()
        process = QProcess(self)
        env = QProcessEnvironment.systemEnvironment()
        # the child finds `engine` whatever the current folder is
        path = os.pathsep.join(p for p in (str(REPO_ROOT), env.value("PYTHONPATH", "")) if p)
        env.insert("PYTHONPATH", path)
        env.insert("PYTHONUNBUFFERED", "1")
        process.setProcessEnvironment(env)
        process.setProgram(self.command[0])
        process.setArguments([*self.command[1:], "import", str(self.source), "--json"])
        process.readyReadStandardOutput.connect(self._on_process_ready_read_stdout)
        process.readyReadStandardError.connect(self._on_process_ready_read_stderr)
        process.finished.connect(self._on_process_finished)
        process.errorOccurred.connect(self._on_process_error_occurred)
        self._process = process
        log.info("importing %s", self.source)
        process.start()
        self.sig_busy_changed.emit(True)

    def cancel(self) -> None:
        """Kill the import now and remove its half-written folder; sig_cancelled follows."""
        process, self._process = self._process, None
        if process is None:
            return
        process.kill()
        process.waitForFinished(KILL_WAIT_MS)  # SIGKILL: reaped within milliseconds
        process.deleteLater()
        self._remove_leftovers()
        log.info("import of %s cancelled", self.source)
        self.sig_cancelled.emit()
        self.sig_busy_changed.emit(False)

    # ------------------------------------------------------------------ slots

    def _on_process_ready_read_stdout(self) -> None:
        if self._is_current(self.sender()):
            self._dispatch(self._stdout.feed(bytes(self._process.readAllStandardOutput())))

    def _on_process_ready_read_stderr(self) -> None:
        if self._is_current(self.sender()):
            self._keep(self._stderr.feed(bytes(self._process.readAllStandardError())))

    def _on_process_finished(self, exit_code: int, exit_status: QProcess.ExitStatus) -> None:
        process = self._process
        if not self._is_current(self.sender()):
            return  # cancel() let it go
        self._dispatch(self._stdout.feed(bytes(process.readAllStandardOutput()))
                       + self._stdout.flush())
        self._keep(self._stderr.feed(bytes(process.readAllStandardError())) + self._stderr.flush())
        if exit_code == 0 and exit_status == QProcess.ExitStatus.NormalExit and self._result:
            self._end(None)
        elif exit_status == QProcess.ExitStatus.CrashExit:
            self._end(self._last_error() or "the import process was killed before it finished")
        else:
            self._end(self._last_error() or f"the import stopped (exit code {exit_code})")

    def _on_process_error_occurred(self, error: QProcess.ProcessError) -> None:
        # every other error is followed by `finished`, which reports it
        if error == QProcess.ProcessError.FailedToStart and self._is_current(self.sender()):
            self._end(f"could not start the import ({self.command[0]}): "
                      f"{self._process.errorString()}")

    # ------------------------------------------------------------------ helpers

    def _is_current(self, process) -> bool:
        return process is not None and process is self._process

    def _end(self, error: str | None) -> None:
        process, self._process = self._process, None
        process.deleteLater()
        if error is None:
            log.info("imported %s into %s", self.source, self._result.folder)
            self.sig_imported.emit(self._result)
        else:
            self._remove_leftovers()  # a crash leaves its work folder behind
            log.warning("import of %s failed: %s", self.source, error)
            self.sig_failed.emit(error)
        self.sig_busy_changed.emit(False)

    def _dispatch(self, lines: list[str]) -> None:
        for line in lines:
            try:
                event = json.loads(line)
                kind = event["event"]
                if kind == "load_progress":
                    self.progress = ImportProgress(str(event["stage"]), int(event["done"]),
                                                   int(event["total"]))
                    self.sig_progress.emit(self.progress)
                elif kind == "imported":
                    gguf = event.get("gguf_bytes")
                    self._result = ImportResult(Path(event["folder"]),
                                                int(event["weights_bytes"]),
                                                int(gguf) if gguf else None)
            except (ValueError, KeyError, TypeError) as e:
                # a library printing on stdout must not break the import: log and go on
                log.warning("ignoring an import stdout line (%s): %.200s", e, line)

    def _keep(self, lines: list[str]) -> None:
        for line in lines:
            self._stderr_tail.append(line)
            log.info("import: %s", line)

    def _last_error(self) -> str | None:
        """The child's one sentence (`hearth: ...`), else its last line on stderr."""
        for line in reversed(self._stderr_tail):
            if line.startswith("hearth: "):
                return line.removeprefix("hearth: ")
        return self._stderr_tail[-1] if self._stderr_tail else None

    def _remove_leftovers(self) -> None:
        """Work folders that appeared while this import ran: only a killed import leaves one."""
        for folder in _work_folders() - self._work_before:
            shutil.rmtree(folder, ignore_errors=True)


def _work_folders() -> set[Path]:
    try:
        return {p for p in models_dir().glob(WORK_GLOB) if p.is_dir()}
    except OSError:
        return set()
