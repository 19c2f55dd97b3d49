"""A converted request on the chat-completions path: checked and submitted as the chat route
does it, its answer read as the chat route gives it (a chat.completion body, or its chunks as
dicts), for a protocol's adapter to turn into its own shape.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from pydantic import ValidationError

from engine.server.errors import APIError, bad_request
from engine.server.prompts import Choice, chat_choices
from engine.server.responses import Shape, collect, start, stream
from engine.server.wire import ChatCompletionRequest

SSE_DATA = "data: "


async def checked(request, chat: dict, renamed: dict[str, str]) -> list[Choice]:
    """`chat`: a chat-completions body -> its choices, checked as the chat route checks them;
    `renamed`: its parameter names in the caller's protocol, so a refusal names the field the
    client sent."""
    state = request.app.state
    try:
        body = ChatCompletionRequest.model_validate(chat)
        state.model.require(body.model)
        choices = await chat_choices(body, state.model)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ()))
        name = renamed.get(param.split(".")[0], param)
        raise bad_request(f"{name}: {' '.join(str(first.get('msg')).split())}", name) from None
    except APIError as e:
        if e.param is not None:
            e.param = renamed.get(e.param.split("[")[0], e.param)
        raise
    return choices


async def submit(request, chat: dict, prefix: str, renamed: dict[str, str]) -> Shape:
    """The choices of `checked` submitted to the engine -> the Shape its answer is read through."""
    choices = await checked(request, chat, renamed)
    return start(request.app.state, choices, prefix, chat["model"])


async def whole(shape: Shape, request) -> dict:
    """The answer as the chat route's chat.completion body."""
    return await collect(shape, request)


async def chunks(shape: Shape, request) -> AsyncIterator[dict]:
    """The answer as the chat route's chunks (usage included, last), or an {"error": ...} one:
    the same stream, so a client that leaves cancels its request as there."""
    lines = stream(shape, request, include_usage=True)
    try:
        async for line in lines:
            data = line[len(SSE_DATA):].strip()
            if data == "[DONE]":
                return
            yield json.loads(data)
    finally:
        await lines.aclose()


def sse(event: str, data: dict) -> str:
    """One server-sent event with its name, as Anthropic and the Responses API send them."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
