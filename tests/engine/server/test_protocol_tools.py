"""Tool use and thinking through Anthropic's Messages API and OpenAI's Responses API on a real
`hearth serve`, with the official `anthropic` SDK and the `openai` SDK's responses.create and
responses.stream, on the tiny model that thinks and calls get_weather when thinking is on, and
answers in prose when it is off (tests/fixtures/tool_model.py: its greedy answers are fixed by
its weights): each answer is the chat route's, a call goes back as a tool result, streamed and
whole agree, and clients of every route at once get their own answers whole.
"""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from tests.engine.helpers import hearth_serve
from tests.fixtures import tool_model

anthropic = pytest.importorskip("anthropic")

QUESTION = "What is the weather in Paris?"
ASK = [{"role": "user", "content": QUESTION}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
ANTHROPIC_TOOL = {"name": "get_weather", "input_schema": SCHEMA}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "parameters": SCHEMA}
RESULT = "18 C, clear"
CALLED = (tool_model.CONTENT_BEFORE_CALL, tool_model.THINKING,
          [("get_weather", json.loads(tool_model.ARGUMENTS))])
PLAIN = (tool_model.PLAIN_ANSWER, "", [])


@pytest.fixture(scope="module")
def url(tiny_models, tmp_path_factory):
    folder = tool_model.build(tiny_models["llama"], tmp_path_factory.mktemp("tools") / "m")
    proc, base = hearth_serve("--model", str(folder))
    yield base
    proc.terminate()
    proc.wait(30)


def oa(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def claude(url: str):
    return anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key="unused",
                               max_retries=0, timeout=60)


def chat(url: str, messages: list[dict], **kw):
    return oa(url).chat.completions.create(model="m", messages=messages, tools=[CHAT_TOOL],
                                           temperature=0, max_tokens=64, **kw)


def of_chat(message) -> tuple:
    """(text, thinking, [(name, arguments)]) of a chat message."""
    return (message.content or "", (message.model_extra or {}).get("reasoning_content") or "",
            [(c.function.name, json.loads(c.function.arguments))
             for c in message.tool_calls or []])


def of_deltas(deltas) -> tuple:
    """The same of a chat stream's deltas."""
    calls: dict[int, list] = {}
    for d in deltas:
        for call in d.tool_calls or []:
            calls.setdefault(call.index, []).append(call.function)
    return ("".join(d.content or "" for d in deltas),
            "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas),
            [(parts[0].name, json.loads("".join(p.arguments or "" for p in parts)))
             for _, parts in sorted(calls.items())])


def of_blocks(content) -> tuple:
    """The same of Anthropic content blocks."""
    return ("".join(b.text for b in content if b.type == "text"),
            "".join(b.thinking for b in content if b.type == "thinking"),
            [(b.name, b.input) for b in content if b.type == "tool_use"])


def of_items(output) -> tuple:
    """The same of Responses output items."""
    return ("".join(p.text for i in output if i.type == "message" for p in i.content),
            "".join(p.text for i in output if i.type == "reasoning" for p in i.content or []),
            [(i.name, json.loads(i.arguments)) for i in output if i.type == "function_call"])


def test_an_anthropic_tool_use_round_trip_is_the_chat_routes(url):
    reference = chat(url, ASK)
    ask = dict(model="m", max_tokens=64, tools=[ANTHROPIC_TOOL], extra_body={"temperature": 0})
    answer = claude(url).messages.create(messages=ASK, **ask)
    assert [b.type for b in answer.content] == ["thinking", "text", "tool_use"]
    assert answer.content[0].signature == ""  # nothing signs a local model's thinking
    assert of_blocks(answer.content) == of_chat(reference.choices[0].message) == CALLED
    assert answer.stop_reason == "tool_use"
    assert answer.usage.input_tokens == reference.usage.prompt_tokens
    # the client runs the tool and sends its result back, the assistant turn as it came
    (use,) = [b for b in answer.content if b.type == "tool_use"]
    turn = [*ASK, {"role": "assistant", "content": answer.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": RESULT}]}]
    after = claude(url).messages.create(messages=turn, **ask)
    chat_turn = [*ASK, {"role": "assistant", "content": tool_model.CONTENT_BEFORE_CALL,
                        "reasoning_content": tool_model.THINKING, "tool_calls": [
                            {"id": use.id, "type": "function", "function": {
                                "name": "get_weather", "arguments": json.dumps(use.input)}}]},
                 {"role": "tool", "tool_call_id": use.id, "content": RESULT}]
    chat_after = chat(url, chat_turn)
    assert of_blocks(after.content) == of_chat(chat_after.choices[0].message)
    assert after.usage.input_tokens == chat_after.usage.prompt_tokens > answer.usage.input_tokens
    # thinking off (the template's enable_thinking): this model answers in prose
    prose = claude(url).messages.create(messages=turn, thinking={"type": "disabled"}, **ask)
    assert of_blocks(prose.content) == PLAIN and prose.stop_reason == "end_turn"
    assert of_chat(chat(url, chat_turn, extra_body={"chat_template_kwargs": {
        "enable_thinking": False}}).choices[0].message) == PLAIN


def test_an_anthropic_tool_use_streamed_is_the_whole_one(url):
    ask = dict(model="m", max_tokens=64, messages=ASK, tools=[ANTHROPIC_TOOL],
               extra_body={"temperature": 0})
    whole = claude(url).messages.create(**ask)
    with claude(url).messages.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert of_blocks(final.content) == of_blocks(whole.content) == CALLED
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert (final.stop_reason, final.usage.output_tokens) == ("tool_use",
                                                              whole.usage.output_tokens)
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    pieces = [d.partial_json for d in deltas if d.type == "input_json_delta"]
    assert len(pieces) > 1  # the arguments came as they were generated
    assert json.loads("".join(pieces)) == {"city": "Paris"}
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == \
        tool_model.THINKING
    kinds = [e.type for e in claude(url).messages.create(**ask, stream=True)]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3


def test_a_responses_function_call_round_trip_is_the_chat_routes(url):
    reference = chat(url, ASK)
    ask = dict(model="m", tools=[RESPONSES_TOOL], temperature=0, max_output_tokens=64)
    answer = oa(url).responses.create(input=QUESTION, **ask)
    assert [i.type for i in answer.output] == ["reasoning", "message", "function_call"]
    assert of_items(answer.output) == of_chat(reference.choices[0].message) == CALLED
    assert answer.status == "completed"
    assert answer.usage.input_tokens == reference.usage.prompt_tokens
    (call,) = [i for i in answer.output if i.type == "function_call"]
    assert call.arguments == tool_model.ARGUMENTS
    # the output items sent back as input with the call's output: one assistant turn, as chat's
    result = {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}
    after = oa(url).responses.create(input=[*ASK, *answer.output, result], **ask)
    chat_after = chat(url, [*ASK, {"role": "assistant", "content": tool_model.CONTENT_BEFORE_CALL,
                                   "reasoning_content": tool_model.THINKING,
                                   "tool_calls": [{"id": call.call_id, "type": "function",
                                                   "function": {"name": call.name,
                                                                "arguments": call.arguments}}]},
                              {"role": "tool", "tool_call_id": call.call_id, "content": RESULT}])
    assert of_items(after.output) == of_chat(chat_after.choices[0].message)
    assert after.usage.input_tokens == chat_after.usage.prompt_tokens
    # or the output alone after previous_response_id: the same conversation
    continued = oa(url).responses.create(input=[result], previous_response_id=answer.id, **ask)
    assert of_items(continued.output) == of_items(after.output)
    assert continued.usage.input_tokens == after.usage.input_tokens
    prose = oa(url).responses.create(input=[*ASK, *answer.output, result],
                                     reasoning={"effort": "none"}, **ask)
    assert of_items(prose.output) == PLAIN and prose.output_text == tool_model.PLAIN_ANSWER


def test_a_responses_function_call_streamed_is_the_whole_one_and_kept(url):
    ask = dict(model="m", input=QUESTION, tools=[RESPONSES_TOOL], temperature=0,
               max_output_tokens=64)
    whole = oa(url).responses.create(**ask)
    with oa(url).responses.stream(**ask) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert of_items(final.output) == of_items(whole.output) == CALLED
    assert [i.type for i in final.output] == ["reasoning", "message", "function_call"]
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert kinds.count("response.function_call_arguments.delta") > 1
    assert kinds.count("response.reasoning_text.delta") >= 1
    assert kinds.count("response.output_item.added") == kinds.count(
        "response.output_item.done") == 3
    # stored, both: read back as they were answered, until deleted
    for made in (whole, final):
        kept = oa(url).responses.retrieve(made.id)
        assert kept.id == made.id and of_items(kept.output) == CALLED
        assert kept.usage.output_tokens == made.usage.output_tokens
    oa(url).responses.delete(whole.id)
    with pytest.raises(openai.NotFoundError):
        oa(url).responses.retrieve(whole.id)
    with pytest.raises(openai.BadRequestError) as e:
        oa(url).responses.create(**ask, previous_response_id=whole.id)
    assert e.value.param == "previous_response_id"


def test_a_call_asked_for_is_made_or_cut_short_in_each_protocols_shape(url):
    """tool_choice any (Anthropic) and required (Responses) where this model, thinking off,
    would answer in prose: the grammar makes it call; cut short before its call (one token),
    the chat route's 422 tool_call_missing in each protocol's shape, whole or mid-stream, no
    prose given as an answer."""
    ask = dict(model="m", max_tokens=64, messages=ASK, tools=[ANTHROPIC_TOOL],
               tool_choice={"type": "any"}, thinking={"type": "disabled"},
               extra_body={"temperature": 0})
    made = claude(url).messages.create(**ask)
    assert made.stop_reason == "tool_use" and [b.type for b in made.content] == ["tool_use"]
    ask["max_tokens"] = 1
    with pytest.raises(anthropic.UnprocessableEntityError) as e:
        claude(url).messages.create(**ask)
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.APIStatusError) as e:
        list(claude(url).messages.create(**ask, stream=True))
    assert e.value.body["error"]["message"] and "Sunny" not in str(e.value.body)
    ask = dict(model="m", input=QUESTION, tools=[RESPONSES_TOOL], tool_choice="required",
               reasoning={"effort": "none"}, temperature=0, max_output_tokens=64)
    made = oa(url).responses.create(**ask)
    assert [item.type for item in made.output] == ["function_call"]
    ask["max_output_tokens"] = 1
    with pytest.raises(openai.UnprocessableEntityError) as e:
        oa(url).responses.create(**ask)
    assert (e.value.code, e.value.param) == ("tool_call_missing", "tool_choice")
    events = list(oa(url).responses.create(**ask, stream=True))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2].code == "tool_call_missing"
    assert not any(e.type == "response.output_text.delta" for e in events)


def test_a_call_cut_at_any_token_is_an_answer_or_the_missing_call_never_a_500(url):
    """max_tokens ending the answer at each token of its forced call: before the call opens, the
    422; inside it, a 200 whose tool_use block holds what parses ({} for an unfinished
    object) with stop_reason max_tokens; the whole call, tool_use."""
    ask = dict(model="m", messages=ASK, tools=[ANTHROPIC_TOOL], thinking={"type": "disabled"},
               tool_choice={"type": "any", "disable_parallel_tool_use": True},
               extra_body={"temperature": 0})
    cut_inside = 0
    for n in range(1, 64):
        try:
            answer = claude(url).messages.create(**ask, max_tokens=n)
        except anthropic.UnprocessableEntityError:
            assert cut_inside == 0  # only before the call opens
            continue
        uses = [b for b in answer.content if b.type == "tool_use"]
        assert [u.name for u in uses] == ["get_weather"], answer.content
        if answer.stop_reason == "tool_use":
            assert uses[0].input == json.loads(tool_model.ARGUMENTS)
            break
        assert answer.stop_reason == "max_tokens" and isinstance(uses[0].input, dict)
        cut_inside += 1
    assert cut_inside and answer.stop_reason == "tool_use"


def test_sixteen_clients_of_every_route_at_once_lose_nothing(url):
    """Chat, Messages and Responses clients, streamed and whole, thinking (a call) and not (prose)
    at once: each gets its own answer whole."""

    async def one(i: int, c: openai.AsyncOpenAI, a) -> tuple:
        route, streamed, thinks = i % 3, (i // 3) % 2 == 1, (i // 6) % 2 == 0
        if route == 0:
            off = {} if thinks else {"chat_template_kwargs": {"enable_thinking": False}}
            ask = dict(model="m", messages=ASK, tools=[CHAT_TOOL], temperature=0,
                       max_tokens=64, extra_body=off)
            if streamed:
                deltas = [ch.choices[0].delta async for ch in
                          await c.chat.completions.create(**ask, stream=True) if ch.choices]
                got = of_deltas(deltas)
            else:
                got = of_chat((await c.chat.completions.create(**ask)).choices[0].message)
        elif route == 1:
            ask = dict(model="m", messages=ASK, tools=[ANTHROPIC_TOOL], max_tokens=64,
                       extra_body={"temperature": 0},
                       **({} if thinks else {"thinking": {"type": "disabled"}}))
            if streamed:
                async with a.messages.stream(**ask) as stream:
                    got = of_blocks((await stream.get_final_message()).content)
            else:
                got = of_blocks((await a.messages.create(**ask)).content)
        else:
            ask = dict(model="m", input=QUESTION, tools=[RESPONSES_TOOL], temperature=0,
                       max_output_tokens=64, **({} if thinks else {"reasoning": {"effort":
                                                                                 "none"}}))
            if streamed:
                async with c.responses.stream(**ask) as stream:
                    got = of_items((await stream.get_final_response()).output)
            else:
                got = of_items((await c.responses.create(**ask)).output)
        return i, thinks, got

    async def main():
        # one client of each SDK, their connections many at once
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0,
                                      timeout=120) as c, \
                anthropic.AsyncAnthropic(base_url=url.removesuffix("/v1"), api_key="unused",
                                         max_retries=0, timeout=120) as a:
            return await asyncio.gather(*(one(i, c, a) for i in range(16)))

    results = asyncio.run(main())
    assert len(results) == 16
    assert [(i, got) for i, thinks, got in results if got != (CALLED if thinks else PLAIN)] == []
