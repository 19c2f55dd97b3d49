"""A streamed response from the chat route's chunks, in the Responses API's typed events, each
with its sequence_number: response.created and .in_progress; per output item .output_item.added,
for text .content_part.added, .output_text.delta and .done, .content_part.done, for a function
call .function_call_arguments.delta and .done; .output_item.done; then .completed (or
.incomplete, at max_output_tokens). A failure midway is an `error` event and .failed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from engine.server.protocols import responses_api as api
from engine.server.protocols.chat_path import chunks, sse
from engine.server.responses import Shape


class _Events:
    def __init__(self, resp_id: str):
        self.resp_id, self.sequence = resp_id, 0
        self.items: list[dict] = []  # finished output items
        self.open: dict | None = None  # the item being streamed
        self.key: str | None = None  # "text" or "call:N"

    def event(self, kind: str, **fields) -> str:
        line = sse(kind, {"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1
        return line

    def where(self) -> dict:
        return {"item_id": self.open["id"], "output_index": len(self.items)}

    def start(self, key: str, item: dict) -> list[str]:
        out = self.finish()
        self.open, self.key = item, key
        out.append(self.event("response.output_item.added", output_index=len(self.items),
                              item={**item, "content": []} if item["type"] == "message"
                              else dict(item)))
        if item["type"] == "message":
            out.append(self.event("response.content_part.added", **self.where(),
                                  content_index=0, part=api.output_text("")))
        return out

    def finish(self) -> list[str]:
        """The open item's .done events."""
        item, out = self.open, []
        if item is None:
            return out
        if item["type"] == "message":
            text = item["content"][0]["text"]
            out.append(self.event("response.output_text.done", **self.where(), content_index=0,
                                  text=text, logprobs=[]))
            out.append(self.event("response.content_part.done", **self.where(),
                                  content_index=0, part=api.output_text(text)))
        else:
            out.append(self.event("response.function_call_arguments.done", **self.where(),
                                  name=item["name"], arguments=item["arguments"]))
        item["status"] = "completed"
        out.append(self.event("response.output_item.done", output_index=len(self.items),
                              item=item))
        self.items.append(item)
        self.open = self.key = None
        return out

    def deltas(self, delta: dict) -> list[str]:
        """One chat delta as typed events: text into a message item, each tool call into a
        function_call item of its own."""
        out = []
        if delta.get("content"):
            if self.key != "text":
                out += self.start("text", api.message_item(self.resp_id, "", "in_progress"))
            self.open["content"][0]["text"] += delta["content"]
            out.append(self.event("response.output_text.delta", **self.where(),
                                  content_index=0, delta=delta["content"], logprobs=[]))
        for call in delta.get("tool_calls") or []:
            key, function = f"call:{call.get('index', 0)}", call.get("function") or {}
            if self.key != key:
                out += self.start(key, api.call_item(call.get("id") or "",
                                                     function.get("name") or "", "",
                                                     "in_progress"))
            if function.get("arguments"):
                self.open["arguments"] += function["arguments"]
                out.append(self.event("response.function_call_arguments.delta", **self.where(),
                                      delta=function["arguments"]))
        return out


async def events(shape: Shape, request, body: api.ResponsesRequest,
                 keep: Callable[[dict], None]) -> AsyncIterator[str]:
    """`keep(message)` is given the answer's chat message once the response is whole."""
    resp_id = shape.gen.id
    out = _Events(resp_id)
    begun = api.response(resp_id, body, [], "in_progress", None)
    yield out.event("response.created", response=begun)
    yield out.event("response.in_progress", response=begun)
    finish, usage, text, calls = None, None, [], {}
    async for chunk in chunks(shape, request):
        if "error" in chunk:
            error = chunk["error"]
            yield out.event("error", code=error.get("code") or error.get("type"),
                            message=error.get("message"), param=error.get("param"))
            failed = api.response(resp_id, body, out.items, "failed", None)
            failed["error"] = {"code": "server_error", "message": error.get("message")}
            yield out.event("response.failed", response=failed)
            return
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or []:
                calls.setdefault(call.get("index", 0), []).append(call)
            for line in out.deltas(delta):
                yield line
            finish = choice.get("finish_reason") or finish
    if not out.items and out.open is None:  # nothing said: one empty message, as whole
        for line in out.start("text", api.message_item(resp_id, "", "in_progress")):
            yield line
    for line in out.finish():
        yield line
    status = api.status_of(finish)
    yield out.event(f"response.{status}",
                    response=api.response(resp_id, body, out.items, status, usage))
    keep(_message("".join(text), calls))


def _message(text: str, calls: dict[int, list[dict]]) -> dict:
    """The answer's chat message, from the deltas that streamed it."""
    message: dict = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        message["tool_calls"] = [
            {"id": parts[0].get("id"), "type": "function",
             "function": {"name": (parts[0].get("function") or {}).get("name"),
                          "arguments": "".join((p.get("function") or {}).get("arguments") or ""
                                               for p in parts)}}
            for _, parts in sorted(calls.items())]
    return message
