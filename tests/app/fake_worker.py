"""A stand-in for `python -m engine.cli.worker` that replays recorded event streams (no torch).

Reads JSON-line commands on stdin like the real worker and answers each load or generate with a
recording from tests/app/recordings/; a generate's events carry its id, as the real worker's do
(the recordings themselves hold none: the id is the command's). Behaviour is set through
environment variables:
  HEARTH_FAKE_LOAD, HEARTH_FAKE_GENERATE  recording file names (load.jsonl, generate_hello.jsonl)
  HEARTH_FAKE_DELAY_S       pause between two events (default 0.002)
  HEARTH_FAKE_REPEAT        replay the token events of a generation this many times
  HEARTH_FAKE_CRASH_AFTER   exit with code 3 after this many token events of a generation
  HEARTH_FAKE_CRASH_STDERR  what it writes on stderr as it crashes (default: one line)
  HEARTH_FAKE_NOISE         print a line that is not JSON before the first event
  HEARTH_FAKE_LOG           append every command line received to this file
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.events import (  # noqa: E402
    BadRequest,
    CancelRequest,
    GenerateRequest,
    LoadRequest,
    ShutdownRequest,
    UnloadRequest,
    request_from_json,
)

RECORDINGS = Path(__file__).resolve().parent / "recordings"
DELAY_S = float(os.environ.get("HEARTH_FAKE_DELAY_S", "0.002"))


def read_commands(commands: queue.Queue) -> None:
    """The main thread replays while this one reads, so a cancel lands between two events."""
    for line in sys.stdin:
        log_path = os.environ.get("HEARTH_FAKE_LOG")
        if log_path:
            with open(log_path, "a", encoding="utf-8") as f:
                f.write(line if line.endswith("\n") else line + "\n")
        if line.strip():
            commands.put(line)
    commands.put(None)  # stdin closed


def emit(event: dict, request_id: str | None = None) -> None:
    if request_id is not None:
        event["id"] = request_id
    if "pid" in event:
        event["pid"] = os.getpid()
    if isinstance(event.get("stats"), dict):
        event["stats"]["pid"] = os.getpid()
    data = (json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8")
    # two writes: the app must put a line back together from partial reads
    half = len(data) // 2
    sys.stdout.buffer.write(data[:half])
    sys.stdout.buffer.flush()
    sys.stdout.buffer.write(data[half:])
    sys.stdout.buffer.flush()


def recording(env_name: str, default: str) -> list[dict]:
    path = RECORDINGS / os.environ.get(env_name, default)
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def expand_tokens(events: list[dict], repeat: int) -> list[dict]:
    tokens = [e for e in events if e["event"] == "token"]
    first = next(i for i, e in enumerate(events) if e["event"] == "token")
    return events[:first] + tokens * (repeat - 1) + events[first:]


def replay(events: list[dict], commands: queue.Queue, pending: list[str],
           is_generation: bool, request_id: str | None = None) -> bool:
    """Emit events; returns False when the worker must exit (shutdown or stdin closed).

    A cancel (of this generation's id, or of every one) ends a generation; during a load it is
    ignored (the app ends a load by a kill).
    """
    crash_after = int(os.environ.get("HEARTH_FAKE_CRASH_AFTER", "-1"))
    num_tokens = 0
    last_stats: dict = {}
    for event in events:
        while True:  # commands that arrived while streaming
            try:
                line = commands.get_nowait()
            except queue.Empty:
                break
            if line is None or isinstance(parse(line), ShutdownRequest):
                return False
            cancel = parse(line)
            if isinstance(cancel, CancelRequest):
                if not is_generation or cancel.id not in (None, request_id):
                    continue
                emit({"event": "finished", "reason": "cancelled", "stats": dict(last_stats)},
                     request_id)
                return True
            pending.append(line)
        if event["event"] == "token":
            if num_tokens == crash_after:
                sys.stderr.write(os.environ.get("HEARTH_FAKE_CRASH_STDERR",
                                                 "fake worker: simulated crash\n"))
                sys.stderr.flush()
                os._exit(3)
            num_tokens += 1
        if event["event"] == "stats":
            last_stats = {k: v for k, v in event.items() if k != "event"}
        emit(dict(event), request_id if is_generation else None)
        time.sleep(DELAY_S)
    return True


def parse(line: str):
    try:
        return request_from_json(line)
    except BadRequest as e:
        return e


def main() -> int:
    commands: queue.Queue = queue.Queue()
    threading.Thread(target=read_commands, args=(commands,), daemon=True).start()
    if os.environ.get("HEARTH_FAKE_NOISE"):
        print("a library said hello on stdout", flush=True)
    is_loaded = False
    pending: list[str] = []
    while True:
        line = pending.pop(0) if pending else commands.get()
        if line is None:
            return 0
        request = parse(line)
        if isinstance(request, BadRequest):
            emit({"event": "failed", "error": str(request), "hint": "", "bad_input": True})
        elif isinstance(request, ShutdownRequest):
            return 0
        elif isinstance(request, UnloadRequest):
            is_loaded = False
            emit({"event": "finished", "reason": "unloaded", "stats": {}})  # as the worker
        elif isinstance(request, LoadRequest):
            events = recording("HEARTH_FAKE_LOAD", "load.jsonl")
            is_loaded = events[-1]["event"] == "loaded"
            if not replay(events, commands, pending, is_generation=False):
                return 0
        elif isinstance(request, GenerateRequest):
            if not is_loaded:
                emit({"event": "failed", "error": "no model is loaded", "hint": "load a model",
                      "bad_input": True}, request.id)
                continue
            events = recording("HEARTH_FAKE_GENERATE", "generate_hello.jsonl")
            events = expand_tokens(events, int(os.environ.get("HEARTH_FAKE_REPEAT", "1")))
            if not replay(events, commands, pending, is_generation=True,
                          request_id=request.id):
                return 0
        # a cancel with nothing running is ignored, as the real worker does


if __name__ == "__main__":
    sys.exit(main())
