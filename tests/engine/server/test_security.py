"""Safe defaults: the Bearer key on every route but /health, the Host header check (DNS
rebinding), CORS off unless origins are listed, the body bound; and the bind rules of
`hearth serve` (a non-loopback host needs a key, a port in use is one line and exit 2)."""

from __future__ import annotations

import socket

import httpx
import pytest

from engine.cli import cli
from engine.events import BadRequest
from engine.server.guards import HostCheck, is_loopback
from engine.server.runner import bind
from tests.engine.server.conftest import API_KEY, start_server

Q = {"model": "demo_model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_every_route_but_health_needs_the_key(keyed):
    base = keyed.url.removesuffix("/v1")
    good = {"Authorization": f"Bearer {API_KEY}"}
    for method, path, body in (("GET", "/v1/models", None), ("GET", "/metrics", None),
                               ("POST", "/v1/chat/completions", Q),
                               ("POST", "/v1/completions", {**Q, "prompt": "x"}),
                               ("GET", "/openapi.json", None), ("GET", "/docs", None)):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
            r = httpx.request(method, base + path, json=body, headers=headers, timeout=30)
            assert r.status_code == 401, (path, headers)
            assert r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.request(method, base + path, json=body, headers=good, timeout=30)
        assert r.status_code == 200, (path, r.text)
    assert httpx.get(base + "/health", timeout=30).json()["status"] == "ok"


def test_the_host_header_must_name_this_server(server):
    base = server.url.removesuffix("/v1")
    port = base.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}"):
        assert httpx.get(base + "/v1/models", headers={"Host": host}, timeout=30).status_code \
            == 200, host
    for host in ("evil.example", f"evil.example:{port}", "localhost.evil.example", "10.0.0.5"):
        r = httpx.get(base + "/v1/models", headers={"Host": host}, timeout=30)
        assert r.status_code == 403 and r.json()["error"]["code"] == "invalid_host", host
    # even /health: a rebound page must not learn what runs here
    assert httpx.get(base + "/health", headers={"Host": "evil.example"},
                     timeout=30).status_code == 403


def test_a_wildcard_bind_accepts_ip_literals_but_not_names():
    check = HostCheck(None, "0.0.0.0")
    assert check.allows("192.168.1.20:8000") and check.allows("[fe80::1]:8000")
    assert not check.allows("evil.example:8000") and not check.allows("")
    assert not HostCheck(None, "127.0.0.1").allows("192.168.1.20")
    assert [is_loopback(h) for h in ("localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0",
                                     "192.168.1.2", "example.com")] == [True] * 4 + [False] * 3


def test_cors_is_off_unless_origins_are_listed(server, engine):
    origin = {"Origin": "http://page.example"}
    r = httpx.get(server.url + "/models", headers=origin, timeout=30)
    assert "access-control-allow-origin" not in r.headers
    pre = httpx.options(server.url + "/chat/completions", timeout=30, headers={
        **origin, "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in pre.headers
    srv = start_server(engine, api_key=API_KEY, cors_origins=("http://page.example",))
    try:
        pre = httpx.options(srv.url + "/chat/completions", timeout=30, headers={
            **origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert pre.status_code == 200  # a preflight carries no key
        assert pre.headers["access-control-allow-origin"] == "http://page.example"
        r = httpx.get(srv.url + "/models", timeout=30, headers={
            **origin, "Authorization": f"Bearer {API_KEY}"})
        assert r.headers["access-control-allow-origin"] == "http://page.example"
        other = httpx.get(srv.url + "/models", timeout=30, headers={
            "Origin": "http://other.example", "Authorization": f"Bearer {API_KEY}"})
        assert "access-control-allow-origin" not in other.headers
    finally:
        srv.stop()


def test_the_body_is_bounded(server):
    big = {**Q, "messages": [{"role": "user", "content": "x" * (2 << 20)}]}
    r = httpx.post(server.url + "/chat/completions", json=big, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

    def chunks():  # no Content-Length: counted as it arrives
        yield b'{"model": "demo_model", "messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"y" * 65536
        yield b'"}]}'

    r = httpx.post(server.url + "/chat/completions", content=chunks(), timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "::", "example.com"])
def test_serve_refuses_a_non_loopback_host_without_a_key(host, capsys, monkeypatch):
    monkeypatch.delenv("HEARTH_SERVER_API_KEY", raising=False)
    assert cli.main(["serve", "--host", host]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--api-key" in err and "Traceback" not in err


def test_serve_with_a_port_in_use_is_one_line_and_exit_2(capsys):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        assert cli.main(["serve", "--port", str(port)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "in use" in err
        with pytest.raises(BadRequest):
            bind("127.0.0.1", port)
    finally:
        taken.close()


@pytest.mark.parametrize("argv,words", [
    (["--port", "70000"], "--port"), (["--max-seqs", "0"], "--max-seqs"),
    (["--cors-origin", "page.example"], "--cors-origin"), (["--quant", "q9"], "--quant"),
    (["--model", "/no/such/folder"], "/no/such/folder"), (["--port", "x"], "invalid int"),
    (["--stall-timeout", "0"], "--stall-timeout"), (["--idle-timeout", "nan"], "--idle-timeout"),
    (["--reproducible", "sometimes"], "--reproducible")])
def test_serve_bad_flags_are_one_line_and_exit_2(argv, words, capsys):
    assert cli.main(["serve", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err


def test_serve_with_more_kv_tokens_than_ram_is_one_line_about_the_cache(capsys):
    """Not an allocation failure that blames the model: the arena's size, said in a sentence."""
    assert cli.main(["serve", "--device", "cpu", "--port", "0",
                     "--kv-tokens", str(10**12)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hearth:")]
    assert len(err) == 1 and "KV cache of 1,000,000,000,000 tokens" in err[0]
    assert "--kv-tokens" in err[0] and "Traceback" not in err[0]
