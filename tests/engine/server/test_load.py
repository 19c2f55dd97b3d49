"""Load through the async SDK (200 requests, 32 at a time, half streamed, some cancelled
mid-stream): nothing lost, no malformed stream, every finished greedy answer equal to `hearth
run`'s in fp32 on CPU; a client that leaves frees its request; SIGTERM stops `hearth serve`."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import openai
import pytest

from engine.cli import cli
from engine.events import GenerateRequest, SamplingParams, Token
from tests.engine.helpers import hearth_serve
from tests.engine.server.conftest import LOAD, metric

QUESTIONS = ["What does `locale.getlocale` do?", "What does `os.path.join` do?",
             "Explain `json.dumps`.", "What is a context manager?", "How do I sort a list?",
             "What does `shutil.copy` return?", "Describe `itertools.chain`.", "hello"]
MAX_TOKENS = 12
NUM_REQUESTS, CONCURRENCY = 200, 32


@pytest.fixture(scope="module")
def references():
    """Each question's greedy answer from a fresh Session in fp32 on CPU (the test checks the
    first against `hearth run` itself)."""
    from engine.generate.session import Session

    return answers_alone(Session.load(LOAD))


def answers_alone(session) -> dict[str, str]:
    """Each question's greedy answer from `session`, one request at a time (`hearth run`'s way)."""
    answers = {}
    for q in QUESTIONS:
        req = GenerateRequest(messages=({"role": "user", "content": q},),
                              max_new_tokens=MAX_TOKENS, sampling=SamplingParams(temperature=0))
        answers[q] = "".join(e.text for e in session.generate(req) if isinstance(e, Token))
    return answers


def test_the_references_are_what_hearth_run_prints(references, tmp_path, capsys):
    path = tmp_path / "messages.json"
    path.write_text(json.dumps([{"role": "user", "content": QUESTIONS[0]}]))
    assert cli.main(["run", "--messages", str(path), "--temperature", "0", "--max-new-tokens",
                     str(MAX_TOKENS), "--quant", "fp32", "--device", "cpu"]) == 0
    assert capsys.readouterr().out == references[QUESTIONS[0]]


async def one(client, sem, i: int, model: str) -> tuple[str, str | None]:
    """-> (question, text) or (question, None) when cancelled; raises on a malformed stream."""
    q = QUESTIONS[i % len(QUESTIONS)]
    kw = dict(model=model, messages=[{"role": "user", "content": q}], temperature=0,
              max_tokens=MAX_TOKENS)
    async with sem:
        if i % 2 == 0:
            answer = await client.chat.completions.create(**kw)
            assert answer.choices[0].finish_reason in ("stop", "length")
            return q, answer.choices[0].message.content
        stream = await client.chat.completions.create(**kw, stream=True)
        ids, text, finish, first = set(), "", None, True
        async for chunk in stream:
            ids.add(chunk.id)
            (choice,) = chunk.choices
            assert finish is None, "a chunk after the finish_reason"
            assert (choice.delta.role == "assistant") == first
            first = False
            text += choice.delta.content or ""
            finish = choice.finish_reason
            if i % 10 == 1 and text:  # cancelled mid-stream: the client goes away
                await stream.close()
                return q, None
        assert len(ids) == 1 and finish in ("stop", "length")
        return q, text


def test_200_requests_32_at_a_time_lose_nothing_and_match_hearth_run(server, references):
    check_load(server.url, references)


def check_load(url: str, references: dict[str, str], model: str = "demo_model") -> None:
    """The load through the async SDK against a server at `url` (the GPU's test runs it too):
    0 lost, 0 malformed, every finished answer its reference, nothing left running after."""
    async def main():
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0, timeout=300)
        sem = asyncio.Semaphore(CONCURRENCY)
        results = await asyncio.gather(*(one(client, sem, i, model)
                                         for i in range(NUM_REQUESTS)), return_exceptions=True)
        await client.close()
        return results

    results = asyncio.run(main())
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, failures[:3]  # 0 lost, 0 malformed
    cancelled = [q for q, text in results if text is None]
    assert 5 <= len(cancelled) <= NUM_REQUESTS // 10
    wrong = [(q, text) for q, text in results if text is not None and text != references[q]]
    assert not wrong, wrong[:3]
    deadline = time.monotonic() + 10
    while metric(url, "hearth_requests_running") + metric(url, "hearth_requests_waiting") > 0:
        assert time.monotonic() < deadline, "requests left running after their clients"
        time.sleep(0.05)


def _until(predicate, timeout_s: float = 5) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_client_that_disconnects_frees_its_request(server):
    """Two streams in one batch; the second's client leaves mid-stream: its sequence stops at
    the next step and its blocks go back (read from /metrics), the first runs on."""
    url = server.url + "/chat/completions"
    long = {"model": "demo_model", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1000, "ignore_eos": True, "stream": True, "temperature": 0}
    before = metric(server.url, "hearth_tokens_generated_total")
    with httpx.Client(timeout=30) as a, httpx.Client(timeout=30) as b:
        with a.stream("POST", url, json=long) as running:
            lines = running.iter_lines()
            next(lines)  # the role chunk; then it generates
            with b.stream("POST", url, json=long) as second:
                seconds = second.iter_lines()
                for _ in range(80):  # 40 chunks (and their blank lines): blocks of its own
                    next(seconds)
                assert metric(server.url, "hearth_requests_running") == 2  # one batch
                both = metric(server.url, "hearth_kv_blocks_used")
            # the second's client left: its sequence ends at the next step, its blocks go back
            _until(lambda: metric(server.url, "hearth_requests_running") == 1)
            assert metric(server.url, "hearth_kv_blocks_used") < both
            for _ in range(20):
                assert next(lines) is not None  # the first streams on
        _until(lambda: metric(server.url, "hearth_requests_running") == 0)
    generated = metric(server.url, "hearth_tokens_generated_total") - before
    assert generated < 2000  # both stopped early
    used = metric(server.url, "hearth_kv_blocks_used")
    assert 0 <= used <= metric(server.url, "hearth_kv_blocks_total")


def test_sigterm_stops_hearth_serve_cleanly():
    proc, url = hearth_serve()
    try:
        assert httpx.get(url.removesuffix("/v1") + "/health", timeout=10).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_a_stopped_server_leaves_nothing_on_the_engine(engine):
    """The window starts and stops its server many times over one engine: each stop takes its
    mailbox's step-end callback off the engine, and a server started afterwards still streams."""
    from tests.engine.server.conftest import start_server

    before = len(engine._step_ends)
    for _ in range(3):
        start_server(engine).stop()
    assert len(engine._step_ends) == before
    srv = start_server(engine)
    try:
        assert len(engine._step_ends) == before + 1
        answer = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0).completions.create(
            model="demo_model", prompt="hello", max_tokens=3, temperature=0, stream=True)
        assert sum(1 for c in answer if c.choices and c.choices[0].text) >= 1
    finally:
        srv.stop()
    assert len(engine._step_ends) == before
