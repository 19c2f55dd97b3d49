"""The loop guard on the API: off unless the request asks (`"stop_on_repetition": true`, Hearth's
own extension), and a loop cut short is finish_reason "stop" (not "length", which a client may
read as "ask for more"), streamed or not. A model that loops from its first token
(tests/fixtures/looping.py) serves the requests."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from engine.events import Loaded, LoadRequest
from engine.generate.loop_guard import loop_span
from tests.engine.server.conftest import start_server
from tests.engine.server.test_stream_structure import sse
from tests.fixtures import looping

MAX_TOKENS = 200


@pytest.fixture(scope="module")
def loop_server(tiny_models, tmp_path_factory):
    from engine.server.command import load
    from engine.service.engine import Engine

    folder, cycle = looping.build(tiny_models["llama"], tmp_path_factory.mktemp("loop") / "m")
    eng = Engine()
    thread = threading.Thread(target=eng.run, daemon=True)
    thread.start()
    assert isinstance(load(eng, LoadRequest(str(folder), device="cpu")), Loaded)
    srv = start_server(eng)
    yield srv, cycle
    srv.stop()
    eng.stop()
    thread.join(10)


def complete(srv, cycle, **extra) -> dict:
    body = {"model": "m", "prompt": [cycle[0]], "max_tokens": MAX_TOKENS, "temperature": 0,
            **extra}
    r = httpx.post(srv.url + "/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_api_leaves_the_guard_off_unless_asked(loop_server):
    srv, cycle = loop_server
    free = complete(srv, cycle)
    assert free["choices"][0]["finish_reason"] == "length"
    assert free["usage"]["completion_tokens"] == MAX_TOKENS
    cut = complete(srv, cycle, stop_on_repetition=True)
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["usage"]["completion_tokens"] == loop_span(looping.PERIOD)
    assert free["choices"][0]["text"].startswith(cut["choices"][0]["text"])


def test_a_streamed_loop_ends_with_stop(loop_server):
    srv, cycle = loop_server
    payloads = sse(srv.url + "/completions",
                   {"model": "m", "prompt": [cycle[0]], "max_tokens": MAX_TOKENS,
                    "temperature": 0, "stream": True, "stop_on_repetition": True})
    finishes = [c["choices"][0]["finish_reason"] for c in map(json.loads, payloads[:-1])
                if c["choices"]]
    assert finishes[-1] == "stop" and finishes[:-1] == [None] * (len(finishes) - 1)

