"""`/metrics` in Prometheus' text format: requests running and waiting, tokens generated and KV
blocks used (read from the engine at each scrape), TTFT and inter-token histograms (observed as
the events reach the server), and HTTP requests in flight. One registry per app.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
INTER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class _EngineCollector:
    """What the engine counts itself, read at scrape time."""

    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        e = self.engine
        yield GaugeMetricFamily("hearth_requests_running", "generations running now",
                                value=e.num_running)
        yield GaugeMetricFamily("hearth_requests_waiting", "generations queued behind them",
                                value=e.num_waiting)
        tokens = CounterMetricFamily("hearth_tokens_generated", "tokens generated in all")
        tokens.add_metric([], e.tokens_generated)
        yield tokens
        cache = getattr(e.session, "cache", None)
        blocks = getattr(cache, "blocks", None)
        total = len(blocks.blocks) if blocks is not None else 0
        used = total - blocks.num_available if blocks is not None else 0
        yield GaugeMetricFamily("hearth_kv_blocks_used", "KV cache blocks in use", value=used)
        yield GaugeMetricFamily("hearth_kv_blocks_total", "KV cache blocks in the arena",
                                value=total)


class Metrics:
    def __init__(self, engine):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        self.ttft_s = Histogram("hearth_time_to_first_token_seconds",
                                "from a request's arrival to its first token",
                                buckets=TTFT_BUCKETS, registry=self.registry)
        self.inter_token_s = Histogram("hearth_inter_token_seconds",
                                       "between two token events of one choice",
                                       buckets=INTER_TOKEN_BUCKETS, registry=self.registry)
        self.http_in_flight = Gauge("hearth_http_requests_in_flight",
                                    "HTTP requests being answered (live clients)",
                                    registry=self.registry)
        self.requests = Counter("hearth_http_requests", "/v1 requests answered, by HTTP status",
                                ["status"], registry=self.registry)
        self.stalled = Counter("hearth_stalled_connections", "connections reset because their "
                               "client read nothing of an answer for the stall timeout",
                               registry=self.registry)
        self.overflows = Counter("hearth_output_overflows", "answers cancelled because more of "
                                 "their output waited unread than its bound",
                                 registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestCounter:
    """ASGI middleware: counts the /v1 requests being answered, streams until their last byte,
    and each answered request by status."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        status = 0

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.http_in_flight.inc()
        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.http_in_flight.dec()
            self.metrics.requests.labels(str(status or "disconnected")).inc()
