"""Anthropic's Messages API: its request body, the one adapter each way between it and the
chat-completions shape (system, content blocks, tool_use and tool_result blocks, tools and
tool_choice against OpenAI's messages, tools and tool_calls), and the whole message it answers.
The event sequence of a streamed answer is messages_stream.py's.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from engine.server.errors import bad_request
from engine.server.protocols.chat_path import with_thinking
from engine.server.wire import _Body, extensions

# what a chat request's parameters are called here, for the refusals that name one
RENAMED = {"stop": "stop_sequences", "response_format": "output_config"}
# `thinking`'s type -> the chat template's enable_thinking ("adaptive", or none: the template's
# own default)
THINKING_TYPES = {"enabled": True, "disabled": False}


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class CountTokensRequest(_Body):
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # the chat route's extension


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None  # its `format`: a JSON schema for the answer
    # the chat route's extensions (vLLM's and Hearth's own), taken here too
    repetition_penalty: float | None = Field(None, gt=0)
    ignore_eos: bool = False
    stop_on_repetition: bool = False


def _block_text(value, where: str) -> str:
    """A text: a string, or text blocks (a system prompt, a tool result's content)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad_request(f"{where} must be a string or a list of text blocks", where)
    texts = []
    for j, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or \
                not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise bad_request(f"{where}[{j}] is a {str(kind)[:40]!r} block; this model reads "
                              "text only", where)
        texts.append(block["text"])
    return "\n".join(texts)


def _message(i: int, m: AnthropicMessage) -> list[dict]:
    """One Anthropic message as OpenAI chat messages: a user turn's tool results become `tool`
    messages (first, as they answer the turn before), an assistant's tool_use blocks its
    tool_calls and its thinking blocks its reasoning_content (for the template to render where
    it renders a past turn's thinking; a redacted one holds nothing to read)."""
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    parts, results, calls, thoughts = [], [], [], []
    for j, block in enumerate(m.content):
        kind, where = block.get("type"), f"messages[{i}].content[{j}]"
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "tool_result" and m.role == "user":
            results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                            "content": _block_text(block.get("content", ""), where + ".content")})
        elif kind == "tool_use" and m.role == "assistant":
            calls.append({"id": str(block.get("id", "")), "type": "function",
                          "function": {"name": str(block.get("name", "")),
                                       "arguments": json.dumps(block.get("input", {}))}})
        elif kind == "thinking" and m.role == "assistant" and \
                isinstance(block.get("thinking"), str):
            thoughts.append(block["thinking"])
        elif kind == "redacted_thinking" and m.role == "assistant":
            continue
        else:
            raise bad_request(f"{where} is a {str(kind)[:40]!r} block, which a {m.role} message "
                              "cannot hold here (this model reads text, tool_use and tool_result "
                              "blocks)", f"messages[{i}].content")
    out = results
    reasoning = {"reasoning_content": "\n".join(thoughts)} if thoughts else {}
    if calls:
        out.append({"role": "assistant", "content": parts or None, "tool_calls": calls,
                    **reasoning})
    elif parts or not results:
        out.append({"role": m.role, "content": parts, **reasoning})
    return out


def _tool(i: int, tool: dict) -> dict:
    if tool.get("type", "custom") != "custom":
        raise bad_request(f"tools[{i}] is a {str(tool.get('type'))[:40]!r} tool; this server "
                          "runs client tools only (name, description, input_schema)", "tools")
    function = {"name": tool.get("name"), "parameters": tool.get("input_schema", {})}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: dict) -> str | dict:
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind not in ("auto", "any", "none"):
        raise bad_request(f"tool_choice type {str(kind)[:40]!r} is not one of auto, any, tool, "
                          "none", "tool_choice")
    return {"auto": "auto", "any": "required", "none": "none"}[kind]


def to_chat(body: CountTokensRequest) -> dict:
    """The request as a chat-completions body: the adapter from Anthropic's shape."""
    messages = []
    if body.system:
        messages.append({"role": "system", "content": _block_text(body.system, "system")})
    for i, m in enumerate(body.messages):
        messages.extend(_message(i, m))
    chat: dict = {"model": body.model, "messages": messages}
    if body.tools:
        chat["tools"] = [_tool(i, t) for i, t in enumerate(body.tools)]
    if body.tool_choice:
        chat["tool_choice"] = _tool_choice(body.tool_choice)
        if body.tool_choice.get("disable_parallel_tool_use") and body.tools:
            chat["parallel_tool_calls"] = False
    kind = (body.thinking or {}).get("type")
    chat.update(with_thinking(body.chat_template_kwargs,
                              THINKING_TYPES.get(kind) if isinstance(kind, str) else None))
    if isinstance(body, MessagesRequest):
        chat.update(max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p,
                    top_k=body.top_k, stop=body.stop_sequences, **extensions(body))
        fmt = (body.output_config or {}).get("format")
        if fmt and not isinstance(fmt, dict):
            raise bad_request("output_config.format must be an object", "output_config")
        if fmt:
            chat["response_format"] = {"type": fmt.get("type"), "json_schema": {
                "name": "output", "schema": fmt.get("schema")}}
    return chat


def thinking_block(thinking: str) -> dict:
    # an empty signature: Anthropic signs its thinking so that what a client sends back is
    # known unaltered; a local model's thinking is read back as plain text, checked by nothing
    return {"type": "thinking", "thinking": thinking, "signature": ""}


def from_chat(message: dict) -> list[dict]:
    """A chat.completion message as content blocks: the adapter to Anthropic's shape (a thinking
    block from the chat route's reasoning_content, a text block, even an empty one when there is
    nothing else, then a tool_use block per call)."""
    blocks = []
    calls = message.get("tool_calls") or []
    text, thinking = message.get("content") or "", message.get("reasoning_content")
    if thinking:
        blocks.append(thinking_block(thinking))
    if text or not (calls or blocks):
        blocks.append({"type": "text", "text": text})
    for call in calls:
        function = call["function"]
        blocks.append({"type": "tool_use", "id": call["id"], "name": function["name"],
                       "input": _input(function.get("arguments") or "{}")})
    return blocks


def _input(arguments: str) -> dict:
    """A call's arguments as tool_use input. The grammar holds every finished call to JSON; a
    call cut short (stop_reason max_tokens) has an unfinished object, given as {}: its text came
    in input_json_delta events already when streamed."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def stop_reason(finish: str | None, reason: str | None) -> str:
    """Anthropic's stop_reason from the chat finish_reason and the engine's own reason."""
    if finish == "tool_calls":
        return "tool_use"
    if finish == "length":
        return "max_tokens"
    return "stop_sequence" if reason == "stop_string" else "end_turn"


def stop_sequence(reason: str | None, body: MessagesRequest) -> str | None:
    """The stop sequence that ended the answer: known where one was asked for (the engine does
    not say which of several matched)."""
    stops = body.stop_sequences or []
    return stops[0] if reason == "stop_string" and len(stops) == 1 else None


def message(msg_id: str, model: str, content: list[dict], stop: str | None,
            sequence: str | None, input_tokens: int, output_tokens: int) -> dict:
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop, "stop_sequence": sequence,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}
