"""Request ids in the worker protocol: 16 generations queued at once with random cancels by id
each end in one terminal event carrying their id, the others give what they give alone; a load
or unload waits for the generations queued before it; bad and duplicate ids are refused. The
server inside the worker (`serve`) answers HTTP on the worker's model and reports its stats."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
import urllib.request

import pytest

from engine.cli.worker import Worker
from engine.events import event_from_json

TERMINAL = ("finished", "failed")
PROMPTS = [f"Tell me about {w}" for w in (
    "rivers", "owls", "glass", "tea", "maps", "salt", "bees", "rain", "iron", "moss", "kites",
    "wolves", "clocks", "bread", "stars", "reeds")]


class Lines:
    """A thread-safe stdout: the worker's lines, parsed as (id, event)."""

    def __init__(self):
        self.lines: list[str] = []
        self.changed = threading.Condition()

    def write(self, text: str) -> None:
        with self.changed:
            self.lines.extend(x for x in text.splitlines() if x)
            self.changed.notify_all()

    def flush(self) -> None:
        pass

    def events(self) -> list[tuple[str | None, object]]:
        with self.changed:
            lines = list(self.lines)
        out = []
        for line in lines:
            obj = json.loads(line)
            rid = obj.pop("id", None)
            out.append((rid, event_from_json(json.dumps(obj))))
        return out

    def wait_for(self, done, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while not done():
                left = deadline - time.monotonic()
                assert left > 0, self.lines[-5:]
                self.changed.wait(left)


@pytest.fixture(scope="module")
def worker(one_thread):
    out = Lines()
    worker = Worker(out)
    thread = threading.Thread(target=worker.run_jobs, daemon=True)
    thread.start()
    worker.command(json.dumps({"command": "load", "device": "cpu", "context": 256}))
    out.wait_for(lambda: any('"loaded"' in x or '"failed"' in x for x in out.lines))
    assert out.events()[-1][1].name == "loaded", out.lines[-1]
    yield worker
    worker.engine.stop()
    thread.join(timeout=5)


def _generate(rid: str, prompt: str, max_new_tokens: int = 6) -> str:
    return json.dumps({"command": "generate", "id": rid, "prompt": prompt, "raw": True,
                       "max_new_tokens": max_new_tokens, "ignore_eos": True,
                       "sampling": {"temperature": 0}})


def _by_id(worker: Worker, start: int) -> dict[str, list]:
    streams: dict[str, list] = {}
    for rid, event in worker.out.events()[start:]:
        streams.setdefault(rid, []).append(event)
    return streams


def _ended(worker: Worker, start: int, ids) -> bool:
    streams = _by_id(worker, start)
    return all(any(e.name in TERMINAL for e in streams.get(i, ())) for i in ids)


def _tokens(events) -> list[int]:
    return [t for e in events if e.name == "token" for t in e.token_ids]


def test_sixteen_queued_generations_with_random_cancels_by_id(worker):
    alone = {}
    for i, prompt in enumerate(PROMPTS):
        start, rid = len(worker.out.lines), f"alone-{i}"
        worker.command(_generate(rid, prompt))
        worker.out.wait_for(lambda s=start, r=rid: _ended(worker, s, [r]))
        alone[i] = _tokens(_by_id(worker, start)[rid])
        assert len(alone[i]) == 6

    rng = random.Random(25)
    start = len(worker.out.lines)
    ids = [f"req-{i}" for i in range(len(PROMPTS))]
    # each cancel goes out after a random later submission: some find their request queued,
    # some running, some already finished
    cancel_after = {rid: rng.randrange(ids.index(rid), len(ids)) for rid in rng.sample(ids, 6)}
    for k, (rid, prompt) in enumerate(zip(ids, PROMPTS, strict=True)):
        worker.command(_generate(rid, prompt))
        for target in [t for t, after in cancel_after.items() if after == k]:
            time.sleep(rng.random() * 0.05)
            worker.command(json.dumps({"command": "cancel", "id": target}))
    worker.command(json.dumps({"command": "cancel", "id": "nobody-has-this"}))  # nothing to stop
    worker.out.wait_for(lambda: _ended(worker, start, ids))

    streams = _by_id(worker, start)
    assert set(streams) == set(ids)  # no event without its id, none for an unknown id
    num_cancelled = 0
    for i, rid in enumerate(ids):
        events = streams[rid]
        terminal = [e for e in events if e.name in TERMINAL]
        assert len(terminal) == 1 and events[-1] is terminal[0], (rid, events)
        assert terminal[0].name == "finished", (rid, terminal[0])
        tokens = _tokens(events)
        if terminal[0].reason == "cancelled":
            num_cancelled += 1
            assert tokens == alone[i][:len(tokens)], rid  # what it had, undisturbed
        else:
            assert terminal[0].reason == "max_tokens" and tokens == alone[i], rid
    assert num_cancelled >= 1


def test_cancel_without_an_id_stops_every_queued_generation(worker):
    start = len(worker.out.lines)
    ids = [f"all-{i}" for i in range(4)]
    for rid in ids:
        worker.command(_generate(rid, "Go on and on", max_new_tokens=200))
    worker.command(json.dumps({"command": "cancel"}))
    worker.out.wait_for(lambda: _ended(worker, start, ids))
    ends = {rid: events[-1] for rid, events in _by_id(worker, start).items()}
    assert {e.reason for e in ends.values()} == {"cancelled"} and set(ends) == set(ids)


def test_an_unload_waits_for_the_generations_queued_before_it(worker):
    start = len(worker.out.lines)
    worker.command(_generate("before", "Tell me about owls"))
    worker.command(json.dumps({"command": "unload"}))
    worker.command(_generate("after", "Tell me about owls"))
    worker.out.wait_for(lambda: _ended(worker, start, ["before", "after"]))
    events = worker.out.events()[start:]
    names = [(rid, e.name) for rid, e in events if e.name in (*TERMINAL, "loaded")]
    assert names == [("before", "finished"), (None, "finished"), ("after", "failed")]
    assert events[[rid for rid, _ in events].index(None)][1].reason == "unloaded"
    assert "no model" in events[-1][1].error
    reload = len(worker.out.lines)  # the next tests want the model back
    worker.command(json.dumps({"command": "load", "device": "cpu", "context": 256}))
    worker.out.wait_for(lambda: any(e.name in ("loaded", "failed")
                                    for _, e in worker.out.events()[reload:]))
    assert worker.out.events()[-1][1].name == "loaded"


@pytest.mark.parametrize("rid, words", [
    ("", "1 to 64 printable ASCII"), ("x" * 65, "1 to 64"), ("tab\there", "printable"),
    ("caf\u00e9", "ASCII")])
def test_a_bad_id_is_refused_as_bad_input(worker, rid, words):
    start = len(worker.out.lines)
    worker.command(_generate(rid, "hi"))
    worker.command(json.dumps({"command": "cancel", "id": rid}))
    worker.out.wait_for(lambda: len(worker.out.lines) >= start + 2)
    for got_id, event in worker.out.events()[start:]:
        assert got_id is None and event.name == "failed" and event.bad_input
        assert words in event.error


def test_a_duplicate_id_fails_tagged_while_the_first_runs_on(worker):
    start = len(worker.out.lines)
    worker.command(_generate("twice", "Go on and on", max_new_tokens=30))
    worker.command(_generate("twice", "hi"))
    worker.command(json.dumps({"command": "generate", "id": "bad-one", "prompt": "hi",
                               "max_new_tokens": 0}))
    worker.out.wait_for(lambda: sum(e.name in TERMINAL for _, e in
                                    worker.out.events()[start:]) == 3)
    events = worker.out.events()[start:]
    failed = [(rid, e) for rid, e in events if e.name == "failed"]
    assert [rid for rid, _ in failed] == ["twice", "bad-one"]
    assert "already queued or running" in failed[0][1].error and failed[0][1].bad_input
    assert "max new tokens" in failed[1][1].error  # a bad line's Failed still carries its id
    assert [e.name for rid, e in events if rid == "twice"][-1] == "finished"


def _wait_event(worker: Worker, start: int, name: str, timeout_s: float = 60.0):
    worker.out.wait_for(lambda: any(e.name == name for _, e in worker.out.events()[start:]),
                        timeout_s)
    return next((rid, e) for rid, e in worker.out.events()[start:] if e.name == name)


def _get(url: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def test_the_server_in_the_worker_shares_its_model(worker):
    pytest.importorskip("fastapi")
    start = len(worker.out.lines)
    worker.command(json.dumps({"command": "serve", "id": "srv", "port": 0}))
    _, serving = _wait_event(worker, start, "serving")
    assert serving.url.startswith("http://127.0.0.1:") and serving.url.endswith("/v1")
    models = _get(serving.url + "/models")
    name = models["data"][0]["id"]
    answer = _get(serving.url + "/chat/completions", {
        "model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "temperature": 0})
    assert answer["choices"][0]["finish_reason"] in ("stop", "length")
    _, stats = _wait_event(worker, start, "server_stats", timeout_s=5)
    assert stats.url == serving.url and stats.num_running == stats.num_waiting == 0
    # a second server on the same port: one sentence, tagged with that command's id
    port = int(serving.url.rsplit(":", 1)[1].split("/")[0])
    mark = len(worker.out.lines)
    worker.command(json.dumps({"command": "serve", "id": "srv2", "port": port}))
    rid, failed = _wait_event(worker, mark, "failed")
    assert rid == "srv2" and "already running" in failed.error
    mark = len(worker.out.lines)
    worker.command(json.dumps({"command": "serve_stop"}))
    _wait_event(worker, mark, "server_stopped")
    with pytest.raises(OSError):
        _get(serving.url + "/models")
    # the port is someone else's now: the next serve says so
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        mark = len(worker.out.lines)
        worker.command(json.dumps({"command": "serve", "id": "srv3",
                                   "port": taken.getsockname()[1]}))
        rid, failed = _wait_event(worker, mark, "failed")
    assert rid == "srv3" and "in use" in failed.error and failed.bad_input
    assert "\n" not in failed.error


def test_serving_beyond_this_machine_needs_a_key(worker):
    start = len(worker.out.lines)
    worker.command(json.dumps({"command": "serve", "id": "open", "host": "0.0.0.0"}))
    rid, failed = _wait_event(worker, start, "failed")
    assert rid == "open" and failed.bad_input and "without an API key" in failed.error


@pytest.mark.parametrize("keep", [True, False])
def test_a_kept_server_outlives_the_window_until_a_signal(one_thread, keep):
    """The window gone (stdin ended): a server started with keep answers on, the worker's
    stdout quiet, until the signal comes; without keep it stops with the window."""
    pytest.importorskip("fastapi")
    out = Lines()
    w = Worker(out)
    thread = threading.Thread(target=w.run_jobs, daemon=True)
    thread.start()
    try:
        w.command(json.dumps({"command": "load", "device": "cpu", "context": 256}))
        out.wait_for(lambda: any('"loaded"' in x or '"failed"' in x for x in out.lines))
        w.command(json.dumps({"command": "serve", "port": 0, "keep": keep}))
        _, serving = _wait_event(w, 0, "serving")
        signal = threading.Event()
        waiting = threading.Event()

        def wait_for_signal():
            waiting.set()
            signal.wait(60)

        leaving = threading.Thread(target=w.leave, args=(wait_for_signal,), daemon=True)
        leaving.start()
        if keep:
            assert waiting.wait(10)
            lines = len(out.lines)
            models = _get(serving.url + "/models")  # the window is gone; the server is not
            assert models["data"] and len(out.lines) == lines  # nothing more on stdout
            signal.set()
        leaving.join(30)
        assert not leaving.is_alive() and waiting.is_set() == keep
        with pytest.raises(OSError):
            _get(serving.url + "/models")  # stopped: with the signal, or with the window
    finally:
        w.engine.stop()
        thread.join(timeout=5)


def test_the_windows_chat_and_a_client_run_in_one_batch(worker):
    """The worker's own generation (the window's chat) and an HTTP client's, at once: steps of
    both rows ran, and each stream ended in its own terminal event."""
    pytest.importorskip("fastapi")
    start = len(worker.out.lines)
    worker.command(json.dumps({"command": "serve", "id": "both", "port": 0}))
    _, serving = _wait_event(worker, start, "serving")
    name = _get(serving.url + "/models")["data"][0]["id"]
    before = dict(worker.engine.batch.rows_seen) if worker.engine.batch else {}
    answers = []
    client = threading.Thread(target=lambda: answers.append(_get(
        serving.url + "/chat/completions", {
            "model": name, "messages": [{"role": "user", "content": "Tell me about owls"}],
            "max_tokens": 40, "ignore_eos": True, "temperature": 0})))
    client.start()
    worker.command(_generate("window", "Tell me about rivers", max_new_tokens=40))
    worker.out.wait_for(lambda: _ended(worker, start, ["window"]))
    client.join(60)
    assert answers and answers[0]["usage"]["completion_tokens"] == 40
    assert len(_tokens(_by_id(worker, start)["window"])) == 40
    seen = worker.engine.batch.rows_seen
    assert any(seen[n] > before.get(n, 0) for n in seen if n >= 2), seen  # one batch
    mark = len(worker.out.lines)
    worker.command(json.dumps({"command": "serve_stop"}))
    _wait_event(worker, mark, "server_stopped")
