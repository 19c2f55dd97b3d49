"""The worker under hostile lines: each ends in exactly one terminal event (cancel, shutdown
and a blank line in none), bad input is marked so and names its field, the worker lives on.
The bulk runs in-process on a loaded tiny model; one real `hearth worker` takes the liveness,
invalid-UTF-8, too-long and closed-stdin cases."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cli.worker import MAX_COMMAND_BYTES, Worker, command_lines
from engine.events import Failed, LoadRequest, event_from_json
from engine.generate.session import Session
from tests.engine.helpers import REPO

TERMINAL = ("finished", "failed", "loaded")
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=8)


class InProcess:
    """A Worker fed one line at a time, its jobs run to the end before the next line. The tiny
    session is put back for each line that may be a generate (a load or an unload drops it);
    for the others there is none, so that a load's unload has nothing to collect (0.3 s)."""

    def __init__(self, session):
        self.session, self.out = session, io.StringIO()
        self.worker = Worker(self.out)

    def feed(self, line) -> list:
        maybe_generate = ("generate" in line) if isinstance(line, str) else b"generate" in line
        self.worker.session = self.session if maybe_generate else None
        start = self.out.tell()
        self.worker.command(line)
        self.worker.jobs.put(None)
        self.worker.run_jobs()
        self.out.seek(start)
        events = [event_from_json(x) for x in self.out.read().splitlines()]
        self.out.seek(0, io.SEEK_END)
        return events


@pytest.fixture(scope="module")
def fed(tiny_model, one_thread):
    return InProcess(Session.load(LoadRequest(str(tiny_model), device="cpu", context=64)))


def _answers_nothing(line) -> bool:
    """Cancel and shutdown, and a blank line (no command: the worker has always skipped it)."""
    if not line.strip():
        return True
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and set(obj) == {"command"} and obj["command"] in (
        "cancel", "shutdown")


def _field(valid):
    return st.one_of(valid, valid, valid, JSON)  # mostly valid: whole valid commands happen


def _commands(missing_root):
    missing = st.text("abc./_-", max_size=10).map(lambda s: str(missing_root / f"m{s}"))
    load = st.fixed_dictionaries(
        {"command": st.just("load"),
         "model": missing | JSON.filter(lambda v: v is not None)},  # null: the demo model
        optional={"quant": _field(st.sampled_from(["auto", "bf16", "int8", "nf4", "awq"])),
                  "kv_dtype": _field(st.just("auto")), "context": _field(st.integers(1, 99)),
                  "device": _field(st.sampled_from(["auto", "cpu", "cuda"])),
                  "memory_limit_gib": _field(st.floats(0.5, 8)), "eager": JSON,
                  "compile": JSON, "draft": _field(missing),
                  "num_speculative_tokens": _field(st.integers(0, 20)),
                  "tensor_parallel": _field(st.integers(0, 3)), "lm_head": JSON})
    sampling = st.fixed_dictionaries({}, optional={
        "temperature": _field(st.floats(0, 2)), "top_p": _field(st.floats(0.1, 1)),
        "top_k": _field(st.integers(0, 50)), "repetition_penalty": _field(st.floats(0.5, 2)),
        "seed": _field(st.integers(0, 2**64))})
    generate = st.fixed_dictionaries(
        {"command": st.just("generate")},
        optional={"prompt": _field(st.just("hi")),
                  "messages": _field(st.just([{"role": "user", "content": "hi"}])),
                  "prompt_ids": _field(st.lists(st.integers(0, 3000), max_size=6)),
                  "ignore_eos": JSON, "system": _field(st.just("be brief")),
                  "raw": _field(st.booleans()), "max_new_tokens": _field(st.integers(0, 6)),
                  "stop": _field(st.lists(st.text(max_size=3), max_size=2)),
                  "sampling": _field(sampling), "prompt_lookup": _field(st.booleans()),
                  "num_speculative_tokens": _field(st.integers(0, 4))})
    others = st.fixed_dictionaries(
        {"command": _field(st.sampled_from(["cancel", "unload", "shutdown", "nope"]))},
        optional={"extra": JSON})
    # whole valid generates too, so that finished answers never depend on the draw (with junk in
    # three fields of four, 160 examples once gave only 4)
    valid_generate = st.fixed_dictionaries(
        {"command": st.just("generate"), "prompt": st.just("hi"),
         "max_new_tokens": st.integers(1, 4)})
    as_json = st.one_of(load, generate, valid_generate, others, JSON).map(json.dumps)
    hostile = st.one_of(
        st.binary(max_size=40),  # mostly invalid UTF-8
        st.integers(1, 3000).map(lambda n: "[" * n),
        st.integers(1, 3000).map(lambda n: '{"command": "generate", "messages": '
                                 + "[" * n + "]" * n + "}"),
        st.integers(1, 3).map(lambda n: '{"command": "load", "model": "'
                              + "x" * (n * 2**20) + '"}'))
    return st.one_of(as_json, as_json, as_json, hostile)


def test_thousands_of_lines_each_end_in_one_terminal_event(fed, tmp_path_factory):
    missing_root = tmp_path_factory.mktemp("missing") / "absent"
    counts = {"lines": 0, "finished_generates": 0}

    @settings(max_examples=160, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(_commands(missing_root), min_size=10, max_size=30))
    def check(lines):
        for line in lines:
            events = fed.feed(line)
            counts["lines"] += 1
            if _answers_nothing(line):
                assert events == [], line
                continue
            terminal = [e for e in events if e.name in TERMINAL]
            assert len(terminal) == 1 and events[-1] is terminal[0], (line[:300], events)
            end = terminal[0]
            assert end.name != "loaded", line[:300]  # loads only of missing paths
            # every failure here is the line's fault, and says so
            assert not isinstance(end, Failed) or end.bad_input, (line[:300], end)
            assert "\n" not in getattr(end, "error", "")
            counts["finished_generates"] += end.name == "finished" and '"generate"' in line

    check()
    assert counts["lines"] >= 1500 and counts["finished_generates"] >= 5, counts


@pytest.mark.parametrize("line, field", [
    ('{"command": "generate", "prompt": "hi", "stop": 5}', "stop"),
    ('{"command": "generate", "prompt_ids": 5}', "prompt_ids"),
    ('{"command": "generate", "messages": 5}', "messages"),
    ('{"command": "generate", "prompt": "hi", "sampling": {"top_k": 1.5}}', "top_k"),
    ('{"command": "generate", "prompt": "hi", "sampling": {"seed": -1}}', "seed"),
    ('{"command": "generate", "prompt": "hi", "sampling": {"temperature": Infinity}}',
     "temperature"),
    ('{"command": "generate", "prompt": "hi", "max_new_tokens": "5"}', "max_new_tokens"),
    ('{"command": "generate", "prompt": "\\ud800"}', "prompt"),
    ('{"command": "load", "model": "m", "context": 4096.5}', "context"),
    ('{"command": "load", "model": "m", "eager": "yes"}', "eager"),
    ('{"command": "load", "model": "m\\u0000"}', "model"),
    ('{"command": "load", "model": "m", "context": ' + "9" * 5000 + "}", "digits"),
    ("[" * 100_000, "nested"),
    (b'{"command": "generate", "prompt": "\xff\xfe"}', "UTF-8"),
    ('{"command": ["load"]}', "command"),
])
def test_a_bad_field_fails_as_bad_input_naming_it(fed, line, field):
    events = fed.feed(line)
    assert len(events) == 1 and isinstance(events[0], Failed) and events[0].bad_input
    assert field in events[0].error


def test_a_valid_generate_after_the_garbage_finishes(fed):
    events = fed.feed('{"command": "generate", "prompt": "hi", "raw": true, '
                      '"max_new_tokens": 3, "sampling": {"temperature": 0}}')
    assert events[-1].name == "finished" and events[-1].stats.new_tokens == 3


def test_a_too_long_line_is_skipped_whole_and_the_next_one_read():
    stream = io.BytesIO(b"x" * 100 + b"\n" + b"y" * 5000 + b"\n" + b'{"command": "cancel"}\n')
    assert list(command_lines(stream, max_bytes=1000)) == [
        b"x" * 100 + b"\n", None, b'{"command": "cancel"}\n']


def test_the_real_worker_lives_through_hostile_bytes_and_exits_on_closed_stdin():
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli.cli", "worker"], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        lines = [b"\xff\xfe\xfa not UTF-8\n", b"[" * 100_000 + b"\n",
                 b'{"command": "generate", "stop": 5}\n', b'{"command": "load", "model": 5}\n',
                 b'{"command": "generate", "prompt": "' + b"z" * (MAX_COMMAND_BYTES + 10)
                 + b'"}\n',
                 b'{"command": "generate", "prompt": "\\udfff"}\n',
                 b'{"command": "unload", "x": "\xc3\x28"}\n']
        for line in lines:
            proc.stdin.write(line)
            proc.stdin.flush()
            event = event_from_json(proc.stdout.readline())
            assert isinstance(event, Failed) and event.bad_input, (line[:60], event)
        proc.stdin.write(b'{"command": "cancel"}\n{"command": "generate", "prompt": "hi"}\n')
        proc.stdin.flush()
        assert "no model" in event_from_json(proc.stdout.readline()).error  # alive and well
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0  # it ends by itself once stdin closes; a hang guard
        assert proc.stdout.read() == b""
    finally:
        proc.kill()
        proc.wait()
