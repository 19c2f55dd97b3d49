"""The one adapter each way between each protocol and the chat-completions shape, on tool use
(what the chat route will serve: its tools, tool_calls and `tool` messages), and the bounded
memory of previous responses. Pure functions: no server, no model."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from engine.server.errors import APIError  # noqa: E402
from engine.server.protocols import (  # noqa: E402
    messages,
    messages_stream,
    responses_api,
    responses_stream,
)
from engine.server.protocols.conversations import Conversations  # noqa: E402

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}


def _events(lines: list[str]) -> list[dict]:
    return [json.loads(line.split("data: ", 1)[1]) for line in lines]


def test_an_anthropic_tool_round_trip_reads_as_openai_messages_and_tools():
    body = messages.MessagesRequest(
        model="m", max_tokens=9, system=[{"type": "text", "text": "Be brief."}],
        stop_sequences=["END"], tool_choice={"type": "tool", "name": "get_weather"},
        tools=[{"name": "get_weather", "description": "weather", "input_schema": SCHEMA}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "...", "signature": "s"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather",
                 "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1",
                 "content": [{"type": "text", "text": "Sunny"}]},
                {"type": "text", "text": "Thanks"}]}])
    chat = messages.to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}],
         "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}]
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": SCHEMA, "description": "weather"}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert (chat["max_tokens"], chat["stop"]) == (9, ["END"])
    assert messages.to_chat(body.model_copy(update={"tool_choice": {"type": "any"}}))[
        "tool_choice"] == "required"
    with pytest.raises(APIError) as e:
        messages.to_chat(body.model_copy(update={"tools": [{"type": "web_search_20250305",
                                                            "name": "web_search"}]}))
    assert e.value.status == 400 and "client tools" in e.value.message
    odd = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": 5}]}
    with pytest.raises(APIError) as e:
        messages.to_chat(body.model_copy(update={"messages": [messages.AnthropicMessage(**odd)]}))
    assert e.value.status == 400


def test_openai_tool_calls_come_out_as_anthropic_tool_use_blocks_whole_and_streamed():
    assert messages.from_chat({"content": None, "tool_calls": [CALL]}) == [
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]
    assert messages.from_chat({"content": "", "tool_calls": None}) == [
        {"type": "text", "text": ""}]
    assert messages.stop_reason("tool_calls", "eos") == "tool_use"
    blocks = messages_stream._Blocks()
    lines = messages_stream._deltas(blocks, {"content": "Looking"})
    lines += messages_stream._deltas(blocks, {"tool_calls": [
        {"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": ""}}]})
    lines += messages_stream._deltas(blocks, {"tool_calls": [
        {"index": 0, "function": {"arguments": '{"city": '}}]})
    lines += messages_stream._deltas(blocks, {"tool_calls": [
        {"index": 0, "function": {"arguments": '"Paris"}'}}]})
    lines += blocks.stop()
    events = _events(lines)
    assert [(e["type"], e["index"]) for e in events] == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_delta", 1),
        ("content_block_stop", 1)]
    assert events[3]["content_block"] == {"type": "tool_use", "id": "call_1",
                                          "name": "get_weather", "input": {}}
    assert "".join(e["delta"]["partial_json"] for e in events[4:6]) == '{"city": "Paris"}'


def test_responses_function_items_read_as_openai_messages_and_come_back_as_items():
    body = responses_api.ResponsesRequest(
        model="m", instructions="Be brief.", tool_choice={"type": "function", "name": "w"},
        tools=[{"type": "function", "name": "w", "parameters": SCHEMA, "strict": True}],
        text={"format": {"type": "json_schema", "name": "out", "schema": SCHEMA}},
        input=[{"role": "user", "content": "Weather?"},
               {"type": "reasoning", "id": "r", "summary": []},
               {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                "arguments": CALL["function"]["arguments"]},
               {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}])
    chat, kept = responses_api.to_chat(body, [{"role": "user", "content": "Before"}])
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Before"},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}]
    assert kept == chat["messages"][1:]  # the instructions do not carry over
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "w", "parameters": SCHEMA, "strict": True}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "out", "schema": SCHEMA}}
    with pytest.raises(APIError) as e:
        responses_api.to_chat(body.model_copy(update={"text": {"format": "json"}}), [])
    assert (e.value.status, e.value.param) == (400, "text")
    items = responses_api.from_chat({"content": None, "tool_calls": [CALL]}, "resp-1")
    assert items == [{"type": "function_call", "id": "fc_call_1", "call_id": "call_1",
                      "name": "get_weather", "arguments": CALL["function"]["arguments"],
                      "status": "completed"}]
    out = responses_stream._Events("resp-1")
    lines = out.deltas({"tool_calls": [{"index": 0, "id": "call_1", "function": {
        "name": "get_weather", "arguments": '{"city": '}}]})
    lines += out.deltas({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]})
    lines += out.finish()
    events = _events(lines)
    assert [e["type"] for e in events] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done"]
    assert [e["sequence_number"] for e in events] == list(range(5))
    assert events[-1]["item"] == items[0]


def test_kept_responses_are_bounded_in_count_and_size_and_an_unknown_id_is_a_400():
    kept = Conversations(max_responses=2, max_chars=200)
    for i in range(3):
        kept.keep(f"r{i}", [{"role": "user", "content": str(i)}])
    assert len(kept) == 2 and kept.history("r2")[0]["content"] == "2"
    with pytest.raises(APIError) as e:
        kept.history("r0")  # the oldest went first
    assert (e.value.status, e.value.param) == (400, "previous_response_id")
    kept.keep("big", [{"role": "user", "content": "x" * 150}])
    assert len(kept) == 1  # the others made room for it
    kept.keep("huge", [{"role": "user", "content": "x" * 300}])  # larger than the whole store
    with pytest.raises(APIError):
        kept.history("huge")
    assert kept.history(None) == []


def test_an_answer_that_thinks_gets_a_thinking_block_whole_and_streamed_alike():
    answer = "<think>\nThe user greets me.</think>\n\nHello <b>there</b>"
    assert messages.from_chat({"content": answer}) == [
        {"type": "thinking", "thinking": "\nThe user greets me.", "signature": ""},
        {"type": "text", "text": "Hello <b>there</b>"}]
    assert messages.from_chat({"content": "a <think> b"}) == [
        {"type": "text", "text": "a <think> b"}]
    for size in (1, 3, 7):  # the tags cut anywhere between the pieces
        blocks, lines = messages_stream._Blocks(), []
        for i in range(0, len(answer), size):
            lines += messages_stream._deltas(blocks, {"content": answer[i:i + size]})
        lines += messages_stream._texts(blocks, blocks.split.flush()) + blocks.stop()
        events = _events(lines)
        assert [e["content_block"]["type"] for e in events
                if e["type"] == "content_block_start"] == ["thinking", "text"]
        deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
        assert "".join(d.get("thinking", "") for d in deltas) == "\nThe user greets me."
        assert "".join(d.get("text", "") for d in deltas) == "Hello <b>there</b>"
