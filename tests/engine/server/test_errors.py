"""Every error case: its status, OpenAI's shape `{"error": {message, type, param, code}}`, and
the parameter it names. Bad input is never a 500; a full queue is a 503 with Retry-After; an
error mid-stream is a `data: {"error": ...}` event."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from engine.events import Failed, Finished, Stats, Token
from engine.service.engine import QueueFull
from tests.engine.server.conftest import start_server

Q = [{"role": "user", "content": "hi"}]
CHAT = {"model": "demo_model", "messages": Q}


def post(srv, path: str, body=None, **kw) -> httpx.Response:
    # json.dumps, not httpx's: it writes lone surrogates as \ud800 escapes, and NaN
    return httpx.post(srv.url + path, content=json.dumps(body), timeout=60,
                      headers={"content-type": "application/json"}, **kw)


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


CHAT_CASES = [  # (change to a valid chat body, the param named)
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"n": 9}, "n"),
    ({"temperature": 3}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"seed": 2**64}, "seed"),
    ({"seed": -2**63 - 1}, "seed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": ""}, "stop"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": 5000}, "max_completion_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "\ud800"}]}, "messages[0].content"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
     "tools[0].function.name"),
    ({"logit_bias": {"4096": 5}}, "logit_bias"),  # past the demo model's vocabulary
    ({"logit_bias": {"-1": 5}}, "logit_bias"),
    ({"logit_bias": {"hello": 5}}, "logit_bias"),
    ({"logit_bias": {"1": 101}}, "logit_bias"),
    ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
]


@pytest.mark.parametrize("change,param", CHAT_CASES, ids=[p for _, p in CHAT_CASES])
def test_invalid_chat_parameters_are_400_naming_the_parameter(server, change, param):
    e = error_of(post(server, "/chat/completions", {**CHAT, **change}), 400)
    assert e["type"] == "invalid_request_error" and e["param"] == param


def test_a_prompt_longer_than_the_context_is_400_never_truncated(server):
    long = [{"role": "user", "content": "word " * 2000}]
    for stream in (False, True):
        e = error_of(post(server, "/chat/completions",
                          {"model": "demo_model", "messages": long, "stream": stream}), 400)
        assert e["code"] == "context_length_exceeded" and "1024" in e["message"]
    e = error_of(post(server, "/completions", {"model": "demo_model", "prompt": "x " * 2000}),
                 400)
    assert e["code"] == "context_length_exceeded"
    # fits, but not with the completion asked for: the sum is checked, not cut down
    e = error_of(post(server, "/chat/completions",
                      {**CHAT, "messages": [{"role": "user", "content": "word " * 500}],
                       "max_tokens": 900}), 400)
    assert e["code"] == "context_length_exceeded" and e["param"] == "max_tokens"


COMPLETION_CASES = [
    ({"suffix": "return x"}, "suffix"),
    ({"prompt": [5, 10**6]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"echo": True}, "echo"),
    ({"logprobs": 6}, "logprobs"),
    ({"logit_bias": {"1": -100.5}}, "logit_bias"),
    ({"best_of": 3}, "best_of"),
    ({"prompt": ["a", "b", "c"], "n": 3}, "n"),
]


@pytest.mark.parametrize("change,param", COMPLETION_CASES, ids=[p for _, p in COMPLETION_CASES])
def test_invalid_completion_parameters_are_400(server, change, param):
    body = {"model": "demo_model", "prompt": "import os", **change}
    e = error_of(post(server, "/completions", body), 400)
    assert e["param"] == param


def test_suffix_names_the_missing_fill_in_the_middle_tokens(server):
    e = error_of(post(server, "/completions", {"model": "demo_model", "prompt": "def f(x):",
                                               "suffix": "return x"}), 400)
    assert "fill-in-the-middle" in e["message"]


def test_bad_json_and_bodies_are_400(server):
    url = server.url + "/chat/completions"
    e = error_of(httpx.post(url, content=b"{not json", timeout=30,
                            headers={"content-type": "application/json"}), 400)
    assert "JSON" in e["message"]
    error_of(httpx.post(url, content=b"[1, 2]", timeout=30,
                        headers={"content-type": "application/json"}), 400)
    error_of(httpx.post(url, content=b"NaN", timeout=30,
                        headers={"content-type": "application/json"}), 400)
    error_of(post(server, "/chat/completions", {**CHAT, "temperature": float("nan")}), 400)
    error_of(post(server, "/chat/completions", {"messages": Q}), 400)  # no model


def test_unknown_model_is_404_and_unknown_routes_keep_the_shape(server):
    e = error_of(post(server, "/chat/completions", {**CHAT, "model": "nope"}), 404)
    assert e["code"] == "model_not_found" and e["param"] == "model"
    error_of(httpx.get(server.url + "/models/nope", timeout=30), 404)
    error_of(httpx.get(server.url + "/nowhere", timeout=30), 404)
    error_of(httpx.get(server.url + "/chat/completions", timeout=30), 405)


class FakeEngine:
    """The engine's interface, answering each submit as told (from another thread)."""

    def __init__(self, events=(), full: bool = False):
        self.events, self.full, self.session = list(events), full, None
        self.num_running = self.num_waiting = self.tokens_generated = 0
        self.max_seqs = 64  # /health reports the engine's
        self.cancelled = []

    def submit(self, req, sink, request_id=None):
        if self.full:
            raise QueueFull("256 requests are waiting; try again shortly")
        threading.Thread(target=lambda: [sink(e) for e in self.events]).start()

    def cancel(self, request_id=None):
        self.cancelled.append(request_id)
        return 1


def test_a_full_queue_is_503_with_retry_after(engine):
    srv = start_server(engine, engine_override=FakeEngine(full=True))
    try:
        r = post(srv, "/chat/completions", CHAT)
        e = error_of(r, 503)
        assert e["code"] == "queue_full" and int(r.headers["retry-after"]) >= 1
    finally:
        srv.stop()


def test_an_engine_failure_mid_stream_is_an_error_event_and_400_when_whole(engine):
    events = [Token("Hello", (5,)), Failed("the prompt is odd", bad_input=True)]
    fake = FakeEngine(events)
    srv = start_server(engine, engine_override=fake)
    try:
        with httpx.stream("POST", srv.url + "/chat/completions", timeout=30,
                          json={**CHAT, "stream": True}) as r:
            payloads = [e[6:] for e in r.read().decode().split("\n\n") if e]
        chunks = [json.loads(p) for p in payloads[:-1]]
        assert chunks[1]["choices"][0]["delta"]["content"] == "Hello"
        assert chunks[-1]["error"]["message"] == "the prompt is odd"
        assert payloads[-1] == "[DONE]"
        e = error_of(post(srv, "/chat/completions", CHAT), 400)
        assert e["message"] == "the prompt is odd"
        fake.events = [Token("Hi", (5,)), Finished("max_tokens", Stats(new_tokens=1))]
        ok = post(srv, "/chat/completions", CHAT).json()
        assert ok["choices"][0]["message"]["content"] == "Hi"
        assert ok["choices"][0]["finish_reason"] == "length"
    finally:
        srv.stop()
