"""An engine thread started, and a model loaded on it, the way each front end that holds one
does (`hearth serve`, `hearth bench --concurrency`): the session is built on the thread that
runs it, so what torch keeps per thread (its CPU thread count, which the session's governor
reads as its most) is that thread's own."""

from __future__ import annotations

import threading
from collections.abc import Callable

from engine.config.engine_config import MAX_SEQS
from engine.events import Failed, Loaded, LoadRequest
from engine.service.engine import MAX_WAITING, Engine


def start(name: str, max_seqs: int = MAX_SEQS, max_waiting: int = MAX_WAITING
          ) -> tuple[Engine, threading.Thread]:
    """An Engine running on a new daemon thread called `name`."""
    engine = Engine(max_waiting=max_waiting, max_seqs=max_seqs)
    thread = threading.Thread(target=engine.run, name=name, daemon=True)
    thread.start()
    return engine, thread


def load(engine: Engine, req: LoadRequest, show: Callable[[object], None] = lambda e: None):
    """Load `req` on the engine's thread, each event shown as it comes; -> the terminal one
    (Loaded, Failed, or Finished "cancelled")."""
    done, last = threading.Event(), []

    def sink(event):
        show(event)
        if isinstance(event, (Loaded, Failed)) or getattr(event, "reason", None):
            last.append(event)
            done.set()

    engine.submit(req, sink)
    done.wait()
    return last[0]
