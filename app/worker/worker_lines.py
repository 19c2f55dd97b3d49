"""What comes back from the worker process: its stdout split into JSON lines, the id a line
carries, and the news of its death."""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine.events import event_from_json


@dataclass(frozen=True)
class WorkerDied:
    """The worker process ended without being asked to (a crash, a kill, an out-of-memory)."""

    exit_code: int
    was_signalled: bool  # QProcess.CrashExit: killed by a signal, not a normal exit
    command: str | None  # the command whose stream it left unfinished ("load", "generate")
    stderr_tail: str
    message: str  # one sentence for the user


class JsonLineReader:
    """Splits a byte stream into complete lines, keeping a partial line until its newline comes.

    Decoding happens per complete line, so a UTF-8 character split across two reads is whole.
    """

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[str]:
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        return [s for line in lines if (s := line.decode("utf-8", "replace").strip())]

    def flush(self) -> list[str]:
        """The last line of a stream that ended without a newline."""
        rest, self._pending = self._pending, b""
        text = rest.decode("utf-8", "replace").strip()
        return [text] if text else []


def parse_event(line: str):
    """(event, request id or None) of one stdout line; raises ValueError, KeyError or TypeError
    for a line that is not an event. The worker appends `"id"` to a tagged request's lines."""
    if '"id": ' not in line:
        return event_from_json(line), None
    obj = json.loads(line)
    request_id = obj.pop("id", None) if isinstance(obj, dict) else None
    return event_from_json(json.dumps(obj)), request_id
