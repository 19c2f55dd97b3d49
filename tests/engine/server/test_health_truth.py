"""/health says how many requests the engine batches: the window's server (the worker's own,
engine/cli/worker_server.py) and `hearth serve` read it from the engine they serve."""

from __future__ import annotations

import httpx

from engine.cli.worker_server import WorkerServer
from engine.events import ServeRequest, Serving
from engine.service.engine import Engine


def test_the_windows_server_reports_the_engines_batch(engine):
    events = []
    served = WorkerServer(engine, ServeRequest(port=0), events.append)
    served.start()
    try:
        assert isinstance(events[0], Serving)
        health = httpx.get(served.url.removesuffix("/v1") + "/health", timeout=30).json()
    finally:
        served.stop()
    assert health["max_seqs"] == engine.max_seqs == Engine().max_seqs


def test_hearth_serves_default_is_the_engines(monkeypatch):
    """One default for every front end: the flag's is the Engine's."""
    import argparse

    from engine.server import command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    assert parser.parse_args(["serve"]).max_seqs == Engine().max_seqs
