"""A streamed Anthropic message from the chat route's chunks, in Anthropic's event sequence:
message_start, per content block content_block_start, its deltas (thinking_delta, text_delta,
input_json_delta for a tool call's arguments) and content_block_stop, then message_delta
(stop_reason, usage) and message_stop; a failure midway is an `error` event in Anthropic's
error shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from engine.server.errors import anthropic_error_body
from engine.server.protocols import messages
from engine.server.protocols.chat_path import chunks, sse
from engine.server.protocols.thinking import ThinkingSplit
from engine.server.responses import Shape


class _Blocks:
    """The content blocks opened so far; one is open at a time."""

    def __init__(self):
        self.count = 0
        self.open: str | None = None  # "thinking", "text", or the tool call's index as "call:N"
        self.split = ThinkingSplit()

    def start(self, key: str, block: dict) -> list[str]:
        out = self.stop()
        self.open = key
        out.append(sse("content_block_start", {"type": "content_block_start",
                                               "index": self.count, "content_block": block}))
        return out

    def delta(self, delta: dict) -> str:
        return sse("content_block_delta", {"type": "content_block_delta", "index": self.count,
                                           "delta": delta})

    def stop(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        self.count += 1
        return [sse("content_block_stop", {"type": "content_block_stop",
                                           "index": self.count - 1})]


def _texts(blocks: _Blocks, pieces: list[tuple[str, str]]) -> list[str]:
    """Thinking and text pieces into blocks of their kinds."""
    out = []
    for kind, text in pieces:
        if blocks.open != kind:
            out += blocks.start(kind, messages.thinking_block("") if kind == "thinking"
                                else {"type": "text", "text": ""})
        out.append(blocks.delta({"type": "thinking_delta", "thinking": text}
                                if kind == "thinking" else {"type": "text_delta", "text": text}))
    return out


def _deltas(blocks: _Blocks, delta: dict) -> list[str]:
    """One chat delta as Anthropic's events: text into a text block, each tool call into a
    tool_use block of its own, its arguments as input_json_delta."""
    out = _texts(blocks, blocks.split.feed(delta["content"])) if delta.get("content") else []
    if delta.get("tool_calls"):
        out += _texts(blocks, blocks.split.flush())
    for call in delta.get("tool_calls") or []:
        key, function = f"call:{call.get('index', 0)}", call.get("function") or {}
        if blocks.open != key:
            out += blocks.start(key, {"type": "tool_use", "id": call.get("id"),
                                      "name": function.get("name"), "input": {}})
        if function.get("arguments"):
            out.append(blocks.delta({"type": "input_json_delta",
                                     "partial_json": function["arguments"]}))
    return out


async def events(shape: Shape, request, body: messages.MessagesRequest) -> AsyncIterator[str]:
    gen = shape.gen
    start = messages.message(gen.id, body.model, [], None, None, shape.prompt_tokens, 0)
    yield sse("message_start", {"type": "message_start", "message": start})
    blocks, finish, output_tokens = _Blocks(), None, 0
    async for chunk in chunks(shape, request):
        if "error" in chunk:
            error = chunk["error"]
            status = 400 if error.get("type") == "invalid_request_error" else 500
            if error.get("code") in ("cancelled", "client_too_slow", "client_closed"):
                status = 503
            yield sse("error", anthropic_error_body(status, error.get("message", "")))
            return
        if chunk.get("usage"):
            output_tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk.get("choices") or []:
            for line in _deltas(blocks, choice.get("delta") or {}):
                yield line
            finish = choice.get("finish_reason") or finish
    for line in _texts(blocks, blocks.split.flush()):
        yield line
    if blocks.count == 0 and blocks.open is None:  # nothing said: one empty text block
        for line in blocks.start("text", {"type": "text", "text": ""}):
            yield line
    for line in blocks.stop():
        yield line
    reason = gen.reasons.get(0)
    delta = {"stop_reason": messages.stop_reason(finish, reason),
             "stop_sequence": messages.stop_sequence(reason, body)}
    yield sse("message_delta", {"type": "message_delta", "delta": delta,
                                "usage": {"output_tokens": output_tokens}})
    yield sse("message_stop", {"type": "message_stop"})
