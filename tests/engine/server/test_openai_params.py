"""Parameters read as OpenAI reads them, through the `openai` SDK against a `hearth serve`
subprocess in the reproducible mode: a null max_tokens on completions is its default of 16, any
int64 seed is taken (a negative one too, and repeats), top_p 0 keeps the most likely token
alone, and a client that leaves a non-streamed request is counted as such, not as a stop."""

from __future__ import annotations

import json
import socket
import time

import httpx
import openai
import pytest

from tests.engine.helpers import hearth_serve

QUESTION = [{"role": "user", "content": "What does `locale.getlocale` do?"}]
HANG_GUARD_S = 300  # only a hang trips it: every wait below ends on an event


@pytest.fixture(scope="module")
def served():
    proc, url = hearth_serve("--reproducible", "on")
    try:
        yield url
    finally:
        proc.kill()
        proc.wait()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=HANG_GUARD_S)


def root(url: str) -> str:
    return url.removesuffix("/v1")


def statuses(url: str) -> dict[str, float]:
    """/metrics' hearth_http_requests_total by its status label."""
    out = {}
    for line in httpx.get(root(url) + "/metrics", timeout=30).text.splitlines():
        if line.startswith('hearth_http_requests_total{status="'):
            out[line.split('"')[1]] = float(line.split()[-1])
    return out


def wait_until(predicate) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not predicate():
        assert time.monotonic() < deadline, "the server never got there"
        time.sleep(0.05)


def test_serve_runs_in_the_reproducible_mode_when_asked(served):
    assert httpx.get(root(served) + "/health", timeout=30).json()["reproducible"] is True
    answer = client(served).chat.completions.create(model="demo_model", messages=QUESTION,
                                                    temperature=0, max_tokens=4)
    assert answer.choices[0].message.content


def test_completions_with_a_null_max_tokens_write_16_tokens(served):
    answer = client(served).completions.create(model="demo_model", prompt="def getlocale(",
                                               max_tokens=None, temperature=0,
                                               extra_body={"ignore_eos": True})
    assert answer.usage.completion_tokens == 16
    assert answer.choices[0].finish_reason == "length"


@pytest.mark.parametrize("seed", [-1, -2**63])
def test_a_negative_seed_is_taken_and_repeats(served, seed):
    def sample() -> str:
        return client(served).chat.completions.create(
            model="demo_model", messages=QUESTION, temperature=1.0, max_tokens=12,
            seed=seed).choices[0].message.content

    first = sample()
    assert first and sample() == first


def test_a_seed_outside_int64_and_the_engine_range_is_400_naming_seed(served):
    with pytest.raises(openai.BadRequestError) as e:
        client(served).chat.completions.create(model="demo_model", messages=QUESTION,
                                               seed=-2**63 - 1, max_tokens=2)
    assert e.value.body["param"] == "seed"


def test_top_p_zero_keeps_the_most_likely_token(served):
    c = client(served)
    greedy = c.chat.completions.create(model="demo_model", messages=QUESTION, temperature=0,
                                       max_tokens=12).choices[0].message.content
    for seed in (1, 2):
        nucleus = c.chat.completions.create(model="demo_model", messages=QUESTION,
                                            temperature=1.5, top_p=0, seed=seed, max_tokens=12)
        assert nucleus.choices[0].message.content == greedy


def test_a_client_that_leaves_a_whole_answer_is_counted_as_gone_not_as_a_stop(served):
    before = statuses(served)
    body = json.dumps({"model": "demo_model", "prompt": "hello", "max_tokens": 1000,
                       "ignore_eos": True}).encode()
    host, port = root(served).removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=HANG_GUARD_S) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        wait_until(lambda: httpx.get(root(served) + "/health", timeout=30).json()["running"])
    # the client left while its 1,000 tokens were being written
    wait_until(lambda: statuses(served).get("499", 0) == before.get("499", 0) + 1)
    assert statuses(served).get("503", 0) == before.get("503", 0)
    wait_until(lambda: httpx.get(root(served) + "/health", timeout=30).json()["running"] == 0)
