"""The FastAPI app: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics and the
other protocols' routes (protocols/) over one service.Engine, wrapped in the safe defaults
(guards.py) and, only when origins are listed, CORS.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.server import errors, guards
from engine.server.bridge import Mailbox
from engine.server.connections import Timeouts
from engine.server.metrics import Metrics, RequestCounter
from engine.server.model_view import ModelView
from engine.server.prompts import chat_choices, completion_choices
from engine.server.protocols import routes as protocol_routes
from engine.server.responses import collect, start, stream
from engine.server.wire import ChatCompletionRequest, CompletionRequest

MIN_BODY_BYTES = 1 << 20
BODY_BYTES_PER_TOKEN = 64  # a token is a few bytes of text; JSON escapes take up to 6 a byte


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    extra_host_names: tuple[str, ...] = ()  # more Host header names to accept (tests)
    timeouts: Timeouts = Timeouts()  # for clients that stop reading or never finish asking


def max_body_bytes(context: int) -> int:
    return max(MIN_BODY_BYTES, context * BODY_BYTES_PER_TOKEN)


def create_app(engine, model: ModelView, settings: Settings) -> FastAPI:
    """`engine` has a loaded session; `model` names it and tokenizes for it."""
    app = FastAPI(title="Hearth", version="1", summary="An OpenAI-compatible local server")
    app.state.engine, app.state.model, app.state.settings = engine, model, settings
    metrics = app.state.metrics = Metrics(engine)
    app.state.mailbox = Mailbox(engine)  # closed by the runner when it stops
    created = int(time.time())
    config = getattr(engine.session, "config", None)  # None on a test's stand-in engine
    reproducible = bool(config is not None and config.reproducible)  # hearth serve --reproducible
    errors.install(app)

    def card(name: str) -> dict:
        # Hearth's own fields: how answers are read, chosen from the chat template at load
        return {"id": name, "object": "model", "created": created, "owned_by": "hearth",
                "tool_call_syntax": model.tool_syntax.name,
                "reasoning": "think" if model.thinks else None}

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model.id, "max_seqs": engine.max_seqs,
                "running": engine.num_running, "waiting": engine.num_waiting,
                "reproducible": reproducible}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [card(model.id)]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str):
        model.require(name)
        return card(name)

    async def answer(chat: bool, body, request: Request, choices):
        shape = start(app.state, choices, "chatcmpl" if chat else "cmpl", body.model, chat,
                      body.n or 1)
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(stream(shape, request, usage),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache",
                                              "X-Accel-Buffering": "no"})
        return JSONResponse(await collect(shape, request))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        model.require(body.model)
        return await answer(True, body, request, await chat_choices(body, model))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        model.require(body.model)
        return await answer(False, body, request, await completion_choices(body, model))

    protocol_routes.install(app)

    # outermost last: the Host check, CORS (its preflights carry no key), the key, the body
    app.add_middleware(guards.BodyLimit, max_bytes=max_body_bytes(model.context))
    app.add_middleware(guards.BearerAuth, api_key=settings.api_key)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type", "x-api-key",
                                          "anthropic-version"])
    app.add_middleware(RequestCounter, metrics=metrics)
    app.add_middleware(guards.HostCheck, bound_host=settings.host,
                       extra_names=settings.extra_host_names)
    return app
