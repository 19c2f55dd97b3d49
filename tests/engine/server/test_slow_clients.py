"""Clients that stop reading or never finish asking, against a `hearth serve` subprocess with
short timeouts: streams nobody reads are cancelled and their connections reset, so another
client is answered; idle and half-open connections are closed. Every wait ends on an event; the
one timeout is a generous guard against a hang. Also the bound on a request's waiting output."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import openai
import pytest

from engine.events import Finished, Stats, Token
from tests.engine.helpers import hearth_serve
from tests.engine.server.conftest import metric

HANG_GUARD_S = 300
NUM_STALLED = 4  # each n=8: 32 sequences, twice the batch


@pytest.fixture(scope="module")
def served():
    proc, url = hearth_serve("--stall-timeout", "1", "--idle-timeout", "2", "--max-seqs", "16",
                             "--kv-tokens", "32768")
    try:
        yield url
    finally:
        proc.kill()
        proc.wait()


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
    return host, int(port)


def wait_until(predicate) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not predicate():
        assert time.monotonic() < deadline, "the server never got there"
        time.sleep(0.1)


def is_closed_by_the_server(sock: socket.socket) -> bool:
    """Read whatever is left; True once the server closed or reset the connection (False if
    the guard ran out first)."""
    sock.settimeout(HANG_GUARD_S)
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def stalled_stream(url: str) -> socket.socket:
    """A streamed request for 8 x 1,000 tokens whose client reads nothing: a receive buffer of
    a few KiB, and no recv."""
    body = json.dumps({"model": "demo_model", "prompt": "hello", "n": 8, "max_tokens": 1000,
                       "ignore_eos": True, "temperature": 0, "stream": True}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(address(url))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


def test_streams_nobody_reads_do_not_hold_another_clients_answer(served):
    stalled = [stalled_stream(served) for _ in range(NUM_STALLED)]
    try:
        wait_until(lambda: metric(served, "hearth_requests_running") > 0)
        answer = openai.OpenAI(base_url=served, api_key="x", max_retries=0,
                               timeout=HANG_GUARD_S).chat.completions.create(
            model="demo_model", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
            temperature=0)
        assert answer.choices[0].message.content
        # every stalled stream was cancelled, its connection reset, its blocks given back
        wait_until(lambda: metric(served, "hearth_stalled_connections_total") == NUM_STALLED)
        wait_until(lambda: metric(served, "hearth_requests_running")
                   + metric(served, "hearth_requests_waiting") == 0)
        assert metric(served, "hearth_kv_blocks_used") == 0
        assert all(is_closed_by_the_server(s) for s in stalled)
        # cancelled: they did not run to their 1,000 tokens
        assert metric(served, "hearth_tokens_generated_total") < NUM_STALLED * 8 * 1000
    finally:
        for s in stalled:
            s.close()


@pytest.mark.parametrize("sent", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                                  b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                  b"Content-Type: application/json\r\nContent-Length: 100\r\n"
                                  b"\r\n{\"model\": "],
                         ids=["nothing", "half the headers", "half the body"])
def test_a_connection_without_a_whole_request_is_closed(served, sent):
    with socket.create_connection(address(served)) as sock:
        sock.sendall(sent)
        assert is_closed_by_the_server(sock)
    assert httpx.get(served.removesuffix("/v1") + "/health", timeout=30).status_code == 200


def test_an_idle_keep_alive_connection_is_closed_even_after_a_byte(served):
    """uvicorn's own keep-alive timer stops at the next byte; a byte a while keeps nothing."""
    with socket.create_connection(address(served)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert b"200 OK" in sock.recv(1 << 16)
        sock.sendall(b"G")
        assert is_closed_by_the_server(sock)


# ---------------------------------------------------------------- the output bound, in-process


class _Choice:
    index = 0
    prompt_tokens = 1
    request = None


class _Engine:
    """Just what a ServedGeneration and the metrics ask of the engine; it records cancels."""

    session = None
    num_running = num_waiting = tokens_generated = 0

    def __init__(self):
        self.cancelled = []

    def cancel(self, request_id=None):
        self.cancelled.append(request_id)


def test_output_past_its_bound_cancels_the_request_and_still_ends():
    from engine.server.bridge import BUFFERED_PER_CHOICE, ServedGeneration
    from engine.server.metrics import Metrics

    async def main():
        engine = _Engine()
        metrics = Metrics(engine)
        gen = ServedGeneration(engine, [_Choice()], metrics)
        for _ in range(BUFFERED_PER_CHOICE + 500):  # a client that reads none of it
            gen.queue.put_nowait((0, Token("x", (1,))))
        gen.queue.put_nowait((0, Finished("cancelled", Stats())))
        assert gen.queue.qsize() == BUFFERED_PER_CHOICE + 1  # the bound, and the end
        assert engine.cancelled == [f"{gen.id}-0"]
        assert metrics.registry.get_sample_value("hearth_output_overflows_total") == 1
        assert gen.ended_why.code == "client_too_slow"
        events = [(await gen.next())[1] for _ in range(gen.queue.qsize())]
        assert isinstance(events[-1], Finished) and gen.done

    asyncio.run(main())
