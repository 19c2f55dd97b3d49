"""One engine on the bundled demo model (fp32 on CPU: the reference's numerics), loaded once per
test session, and servers over it on free ports: open, keyed, or with any other Settings."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from engine.events import Loaded, LoadRequest  # noqa: E402

LOAD = LoadRequest(quant="fp32", device="cpu")
API_KEY = "test-key-0123456789"


@pytest.fixture(scope="session")
def engine():
    from engine.server.command import load
    from engine.service.engine import Engine

    eng = Engine()
    thread = threading.Thread(target=eng.run, daemon=True)
    thread.start()
    loaded = load(eng, LOAD)
    assert isinstance(loaded, Loaded), loaded
    yield eng
    eng.stop()
    thread.join(10)


def start_server(engine, model_given: str | None = None, engine_override=None, **settings):
    """A BackgroundServer on 127.0.0.1 and a free port over `engine` (or a stand-in for it)."""
    from engine.server.app import Settings, create_app
    from engine.server.model_view import ModelView
    from engine.server.runner import BackgroundServer, bind

    sock = bind(settings.pop("bind_host", "127.0.0.1"), 0)
    port = sock.getsockname()[1]
    serving = engine_override or engine
    app = create_app(serving, ModelView.of(engine.session, model_given),
                     Settings(port=port, **settings))
    return BackgroundServer(app, serving, sock).start()


@pytest.fixture(scope="session")
def server(engine):
    srv = start_server(engine)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def keyed(engine):
    srv = start_server(engine, api_key=API_KEY)
    yield srv
    srv.stop()


def metric(base_url: str, name: str, headers: dict | None = None) -> float:
    """One sample's value from /metrics (no labels)."""
    import httpx

    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", headers=headers).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


@contextlib.contextmanager
def keyed_hearth_serve(*args: str):
    """A real `hearth serve` subprocess on the demo model that asks for API_KEY -> its base URL
    (http://127.0.0.1:PORT/v1); ended (SIGTERM) on leaving."""
    from tests.engine.helpers import hearth_serve, stop_server

    proc, url = hearth_serve("--api-key", API_KEY, *args)
    try:
        yield url
    finally:
        stop_server(proc)


def wait_idle(url: str, timeout_s: float = 120) -> None:
    """Until the server runs and queues nothing (a bound on a hang, not a timing)."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    deadline = time.monotonic() + timeout_s
    while metric(url, "hearth_requests_running", headers) + \
            metric(url, "hearth_requests_waiting", headers) > 0:
        assert time.monotonic() < deadline, "requests left running after their clients"
        time.sleep(0.05)
