"""What a running Hearth server says about itself: GET /health (open) and /metrics (with the key),
read over the standard library's HTTP client, so the window's Server panel can show a
`hearth serve` started in a terminal (another process) the way it shows its own."""

from __future__ import annotations

import http.client
import json
import math
from dataclasses import dataclass

from engine.events import BadRequest
from engine.remote.base_url import parse_base_url
from engine.remote.client import MAX_BODY_BYTES, _connect, _read_body, _send
from engine.remote.failures import RemoteError

TIMEOUT_S = 2.0  # a local server answers at once; the panel asks again in a second
GAUGES = {"hearth_requests_running": "running", "hearth_requests_waiting": "waiting",
          "hearth_http_requests_in_flight": "clients", "hearth_tokens_generated_total": "tokens",
          "hearth_kv_blocks_used": "kv_used", "hearth_kv_blocks_total": "kv_total"}


@dataclass(frozen=True)
class ServerFigures:
    model: str
    running: int = 0
    waiting: int = 0
    clients: int = 0  # HTTP requests being answered
    tokens: int = 0  # generated since the server started
    kv_used: int = 0
    kv_total: int = 0
    metrics_refused: bool = False  # /metrics wants a key this panel does not have


def parse_metrics(text: str) -> dict[str, int]:
    """The unlabelled samples GAUGES names, from Prometheus' text format."""
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in GAUGES:
            try:
                number = float(value.split()[0])
            except (ValueError, IndexError):
                continue
            if math.isfinite(number):
                found[GAUGES[name]] = int(number)
    return found


def read_server(url: str, api_key: str | None = None) -> ServerFigures | None:
    """The figures of the Hearth server at `url` (http://host:port, with or without /v1); None
    where nothing answers there or what answers is not a Hearth server."""
    try:
        base = parse_base_url(url.rstrip("/").removesuffix("/v1"))
    except BadRequest:
        return None
    try:
        health = json.loads(_get(base, "/health", None)[1])
    except (RemoteError, ValueError, OSError, http.client.HTTPException):
        return None
    if not (isinstance(health, dict) and health.get("status") == "ok"
            and isinstance(health.get("model"), str) and "max_seqs" in health):
        return None
    try:
        status, body = _get(base, "/metrics", api_key)
    except (RemoteError, OSError, http.client.HTTPException):  # whatever the peer does
        return None
    model = health["model"][:200]  # shown in the panel: a hostile server's name stays short
    if status in (401, 403):
        return ServerFigures(model, metrics_refused=True)
    if status != 200:
        return None
    return ServerFigures(model, **parse_metrics(body.decode("utf-8", "replace")))


def _get(base, path: str, api_key: str | None) -> tuple[int, bytes]:
    conn, _sock = _connect(base, TIMEOUT_S)
    try:
        response = _send(conn, base, "GET", path, None, api_key)
        if response.status != 200:
            return response.status, response.read(MAX_BODY_BYTES)
        return 200, _read_body(response, base.where)
    finally:
        conn.close()
