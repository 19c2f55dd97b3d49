"""OpenAI's Responses API: its request body, the one adapter each way between it and the
chat-completions shape (instructions, input as a string or items, function tools, function_call
and function_call_output items, text.format against OpenAI's messages, tools, tool_calls and
response_format), and the response object it answers. Streaming is responses_stream.py's.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import Field

from engine.server.errors import bad_request
from engine.server.wire import _Body, extensions

RENAMED = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text",
           "tools": "tools", "stop": "stop"}
TEXT_PARTS = ("input_text", "output_text", "text")
ROLES = ("user", "assistant", "system", "developer")


class ResponsesRequest(_Body):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool = True
    background: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    # the chat route's extensions (vLLM's and Hearth's own), taken here too
    top_k: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0)
    ignore_eos: bool = False
    stop_on_repetition: bool = False


def _content(value, where: str) -> str | list[dict]:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(f"{where} must be a string or a list of text parts", "input")
    parts = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad_request(f"{where}[{j}] is a {str(kind)[:40]!r} part; this model reads text "
                              "parts only", "input")
        parts.append({"type": "text", "text": part["text"]})
    return parts


def input_messages(value: str | list[dict]) -> list[dict]:
    """`input` as chat messages: the adapter from the Responses items (messages, function calls
    as an assistant's tool_calls, their outputs as `tool` messages; past reasoning skipped)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    out: list[dict] = []
    for i, item in enumerate(value):
        kind, where = item.get("type", "message"), f"input[{i}]"
        if kind == "message":
            if item.get("role") not in ROLES:
                raise bad_request(f"{where}.role {str(item.get('role'))[:40]!r} is not one of "
                                  f"{', '.join(ROLES)}", "input")
            out.append({"role": item["role"], "content": _content(item.get("content"),
                                                                  where + ".content")})
        elif kind == "function_call":
            call = {"id": str(item.get("call_id", "")), "type": "function",
                    "function": {"name": str(item.get("name", "")),
                                 "arguments": str(item.get("arguments", ""))}}
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                        "content": _content(output, where + ".output")})
        elif kind != "reasoning":
            raise bad_request(f"{where} is a {str(kind)[:40]!r} item; this server reads message, "
                              "function_call and function_call_output items", "input")
    return out


def _tools(body: ResponsesRequest) -> dict:
    chat: dict = {}
    if body.tools:
        tools = []
        for i, t in enumerate(body.tools):
            if t.get("type") != "function":
                raise bad_request(f"tools[{i}] is a {str(t.get('type'))[:40]!r} tool; this "
                                  "server runs function tools only", "tools")
            tools.append({"type": "function", "function": {
                k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}})
        chat["tools"] = tools
    choice = body.tool_choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        chat["tool_choice"] = choice
    if body.parallel_tool_calls is not None and body.tools:
        chat["parallel_tool_calls"] = body.parallel_tool_calls
    return chat


def _response_format(text: dict | None) -> dict | None:
    fmt = (text or {}).get("format")
    if fmt and not isinstance(fmt, dict):
        raise bad_request("text.format must be an object", "text")
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}}
    return {"type": fmt.get("type")}


def to_chat(body: ResponsesRequest, history: list[dict]) -> tuple[dict, list[dict]]:
    """The request as a chat-completions body after `history` (a previous response's
    conversation) -> (the body, the conversation without the instructions, to keep)."""
    if body.background:
        raise bad_request("background responses are not supported by this server",
                          "background")
    conversation = [*history, *input_messages(body.input)]
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    chat = {"model": body.model, "messages": system + conversation,
            "max_tokens": body.max_output_tokens, "temperature": body.temperature,
            "top_p": body.top_p, "top_k": body.top_k, **extensions(body), **_tools(body)}
    response_format = _response_format(body.text)
    if response_format is not None:
        chat["response_format"] = response_format
    return chat, conversation


def from_chat(message: dict, resp_id: str) -> list[dict]:
    """A chat.completion message as output items: the adapter to the Responses shape (a message
    item, unless only tool calls came, then a function_call item per call)."""
    items = []
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        items.append(message_item(resp_id, message.get("content") or "", "completed"))
    for call in calls:
        items.append(call_item(call["id"], call["function"]["name"],
                               call["function"].get("arguments") or "", "completed"))
    return items


def message_item(resp_id: str, text: str | None, status: str) -> dict:
    content = [] if text is None else [output_text(text)]
    return {"type": "message", "id": "msg_" + resp_id.removeprefix("resp-"), "status": status,
            "role": "assistant", "content": content}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"type": "function_call", "id": "fc_" + call_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def response(resp_id: str, body: ResponsesRequest, output: list[dict], status: str,
             usage: dict | None) -> dict:
    """The response object; `status` in_progress, completed, incomplete or failed."""
    usage_out = None if usage is None else {
        "input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": usage["total_tokens"]}
    return {"id": resp_id, "object": "response", "created_at": int(time.time()),
            "status": status, "error": None, "model": body.model,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
            else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "output": output, "parallel_tool_calls": bool(body.parallel_tool_calls
                                                          if body.parallel_tool_calls is not None
                                                          else True),
            "previous_response_id": body.previous_response_id, "temperature": body.temperature,
            "top_p": body.top_p, "tool_choice": body.tool_choice or "auto",
            "tools": body.tools or [], "text": body.text or {"format": {"type": "text"}},
            "truncation": "disabled", "store": body.store, "metadata": body.metadata or {},
            "usage": usage_out}


def status_of(finish: str | None) -> str:
    return "incomplete" if finish == "length" else "completed"


def answer_message(message: dict) -> dict:
    """The answer as the chat message the conversation keeps for a next turn."""
    calls = message.get("tool_calls")
    kept = {"role": "assistant", "content": message.get("content") or (None if calls else "")}
    if calls:
        kept["tool_calls"] = calls
    return kept
