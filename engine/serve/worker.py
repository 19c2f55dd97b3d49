"""The engine process the app drives: JSON-line commands on stdin, events on stdout.

The main thread reads commands, so a cancel lands while the engine thread generates (between
two steps) or loads (between two stages). Every line that is not a cancel or a shutdown, whatever
it holds, ends in one terminal event (a bad one in `Failed(bad_input=True)`) and the worker stays
alive. stdout carries events only: anything else printed goes to stderr.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Iterable, Iterator

from engine.events import (
    BadRequest,
    CancelRequest,
    Failed,
    Finished,
    GenerateRequest,
    LoadRequest,
    ShutdownRequest,
    UnloadRequest,
    event_to_json,
    request_from_json,
)

MAX_COMMAND_BYTES = 64 * 2**20  # a 1M-token conversation is a few MB; past this, not a command


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


JOIN_TIMEOUT_S = 1.0


class Worker:
    def __init__(self, out):
        self.out = out
        self.lock = threading.Lock()
        self.jobs: queue.Queue = queue.Queue()
        self.cancels: list[threading.Event] = []  # one per queued or running job
        self.session = None

    def emit(self, event) -> None:
        with self.lock:
            self.out.write(event_to_json(event) + "\n")
            self.out.flush()

    def read_commands(self, lines: Iterable[str | bytes | None]) -> None:
        """Main thread: answer each line (see `command`), then stop what runs and leave."""
        for line in lines:
            if not self.command(line):
                break
        self._cancel_all()  # shutdown or stdin closed: stop what runs, then leave
        self.jobs.put(None)

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
            if isinstance(req, (LoadRequest, GenerateRequest)):
                req.validate()  # before the queue: a wrong field fails at once, model or not
        except BadRequest as e:
            self.emit(Failed(str(e), bad_input=True))
            return True
        except Exception as e:  # a line must never end the reading loop, whatever it holds
            self.emit(Failed(f"cannot read the command: {type(e).__name__}", bad_input=True))
            return True
        if isinstance(req, CancelRequest):
            self._cancel_all()
            return True
        if isinstance(req, ShutdownRequest):
            return False
        cancel = threading.Event()
        with self.lock:
            self.cancels.append(cancel)
        self.jobs.put((req, cancel))
        return True

    def _cancel_all(self) -> None:
        with self.lock:
            for cancel in self.cancels:
                cancel.set()

    def run_jobs(self) -> None:
        """Engine thread: one job at a time; every job's stream ends in a terminal event."""
        while (job := self.jobs.get()) is not None:
            req, cancel = job
            try:
                self._run(req, cancel)
            except Exception as e:  # a broken job must not take the worker down
                self.emit(Failed(f"{type(e).__name__}: {e}"))
            with self.lock:
                self.cancels.remove(cancel)

    def _run(self, req, cancel: threading.Event) -> None:
        if isinstance(req, LoadRequest):
            self._load(req, cancel)
        elif isinstance(req, UnloadRequest):
            self._unload()
            self.emit(Finished("unloaded"))
        elif isinstance(req, GenerateRequest):
            if self.session is None:
                self.emit(Failed("no model is loaded", hint="send a load command first",
                                 bad_input=True))
                return
            for event in self.session.generate(req, cancel):
                self.emit(event)

    def _load(self, req: LoadRequest, cancel: threading.Event) -> None:
        from engine.generate.session import Session
        from engine.load.loader import LoadCancelled
        from engine.parallel.session import TPSession
        from engine.plan.oom import OutOfMemory

        self._unload()
        try:
            # N > 1: this process is rank 0 and starts, supervises and ends the other ranks
            opener = TPSession if req.tensor_parallel > 1 else Session
            self.session = opener.load(req, self.emit, cancel)
        except BadRequest as e:
            self.emit(Failed(str(e), bad_input=True))
            return
        except LoadCancelled:
            self.emit(Finished("cancelled"))
            return
        except OutOfMemory as e:  # memory already released: the next load can succeed
            self.emit(Failed(str(e), hint=e.hint))
            return
        self.emit(self.session.loaded_event())

    def _unload(self) -> None:
        if self.session is not None:
            from engine.load.loader import clear_memory_limit
            from engine.parallel.session import TPSession

            if isinstance(self.session, TPSession):
                self.session.close()  # its follower processes end with it
            device = self.session.lm.device
            self.session = None
            import gc

            import torch

            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            clear_memory_limit(device)  # a --memory-limit is its load's, not the next one's


def main() -> int:
    out = sys.stdout
    sys.stdout = sys.stderr  # library prints must never corrupt the event stream
    worker = Worker(out)
    engine = threading.Thread(target=worker.run_jobs, name="hearth-engine", daemon=True)
    engine.start()
    worker.read_commands(command_lines(sys.stdin.buffer))
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
