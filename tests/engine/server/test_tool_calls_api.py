"""Tool calls and reasoning through a real `hearth serve` and the `openai` SDK, on a tiny model
that thinks and calls get_weather when thinking is on, and answers in prose when it is off
(tests/fixtures/tool_model.py: its greedy answers are fixed by its weights)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.engine.helpers import hearth_serve
from tests.fixtures import tool_model

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def served(tiny_models, tmp_path_factory):
    folder = tool_model.build(tiny_models["llama"], tmp_path_factory.mktemp("tools") / "m")
    proc, url = hearth_serve("--model", str(folder))
    yield folder, url
    proc.terminate()
    proc.wait(30)


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def ask(url: str, **kw):
    return client(url).chat.completions.create(model="m", temperature=0, max_tokens=64,
                                               **{"messages": ASK, **kw})


def test_models_name_the_call_syntax_and_reasoning_read_from_the_template(served):
    _, url = served
    card = httpx.get(url + "/models", timeout=10).json()["data"][0]
    assert card["tool_call_syntax"] == "hermes" and card["reasoning"] == "think"


def test_a_call_streamed_reassembles_to_the_non_streamed_call(served):
    _, url = served
    whole = ask(url, tools=[WEATHER])
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather" and call.function.arguments == tool_model.ARGUMENTS
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert choice.message.content == tool_model.CONTENT_BEFORE_CALL
    assert choice.message.model_extra["reasoning_content"] == tool_model.THINKING

    chunks = list(ask(url, tools=[WEATHER], stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
    first, rest = calls[0], calls[1:]
    # OpenAI's shape: the first delta names the call, the later ones carry argument fragments
    assert (first.index, first.type, first.function.name, first.function.arguments) == (
        0, "function", "get_weather", "")
    assert first.id and all(d.id is None and d.function.name is None for d in rest)
    assert len(rest) > 1  # the arguments came as they were generated, not in one piece
    assert "".join(d.function.arguments for d in rest) == call.function.arguments
    content = "".join(d.content or "" for d in deltas)
    assert content == choice.message.content  # no piece of the `<tool_call>` marker leaked
    thinking = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert thinking == tool_model.THINKING
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_the_sdks_stream_helper_reads_the_call(served):
    _, url = served
    with client(url).chat.completions.stream(model="m", messages=ASK, tools=[WEATHER],
                                             temperature=0, max_tokens=64) as stream:
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather",
                                                             tool_model.ARGUMENTS)


def test_enable_thinking_false_reaches_the_template(served):
    _, url = served
    thinking = ask(url, tools=[WEATHER])
    plain = ask(url, tools=[WEATHER], extra_body=NO_THINKING)
    message = plain.choices[0].message
    assert message.content == tool_model.PLAIN_ANSWER and not message.tool_calls
    assert message.model_extra["reasoning_content"] is None
    assert plain.choices[0].finish_reason == "stop"
    # the template's closed <think>\n\n</think>\n\n: more prompt
    assert plain.usage.prompt_tokens > thinking.usage.prompt_tokens
    chunks = list(ask(url, extra_body=NO_THINKING, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        tool_model.PLAIN_ANSWER


def test_tool_choice_none_renders_no_tools_and_parses_no_call(served):
    _, url = served
    with_tools = ask(url, tools=[WEATHER])
    none = ask(url, tools=[WEATHER], tool_choice="none")
    message = none.choices[0].message
    assert not message.tool_calls and none.choices[0].finish_reason == "stop"
    assert message.content.startswith(tool_model.CONTENT_BEFORE_CALL + "\n<tool_call>")
    assert message.model_extra["reasoning_content"] == tool_model.THINKING
    assert none.usage.prompt_tokens < with_tools.usage.prompt_tokens


def test_a_named_function_is_called_and_another_name_is_a_missing_call(served):
    _, url = served
    named = ask(url, tools=[WEATHER, TIME],
                tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.choices[0].message.tool_calls[0].function.name == "get_weather"
    with pytest.raises(openai.UnprocessableEntityError) as e:
        ask(url, tools=[WEATHER, TIME],
            tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert e.value.code == "tool_call_missing"


def test_required_without_a_call_is_an_outcome_of_its_own(served):
    _, url = served
    with pytest.raises(openai.UnprocessableEntityError) as e:
        ask(url, tools=[WEATHER], tool_choice="required", extra_body=NO_THINKING)
    assert e.value.code == "tool_call_missing" and e.value.param == "tool_choice"
    events = []
    with httpx.stream("POST", url + "/chat/completions", timeout=60, json={
            "model": "m", "messages": ASK, "tools": [WEATHER], "tool_choice": "required",
            "temperature": 0, "stream": True, **NO_THINKING}) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "tool_call_missing"
    # the prose was held back: a client of "required" never sees it as an answer
    assert not any("Sunny" in e for e in events)


def test_a_history_of_calls_and_results_renders_as_transformers_renders_it(served):
    folder, url = served
    from transformers import AutoTokenizer

    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18 C, clear"}]
    answer = ask(url, messages=history, tools=[WEATHER])
    assert answer.choices[0].finish_reason == "tool_calls"
    tok = AutoTokenizer.from_pretrained(folder)
    as_read = [*ASK, {"role": "assistant", "tool_calls": [
        {**call, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        history[-1]]
    ids = tok.apply_chat_template(as_read, tools=[WEATHER], add_generation_prompt=True,
                                  tokenize=True, return_dict=True)["input_ids"]
    assert answer.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize("body, param", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"chat_template_kwargs": {"enable_thinking": {"nested": True}}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"tools": "x"}}, "chat_template_kwargs"),
    ({"messages": [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages[1].tool_calls"),
])
def test_bad_tool_requests_are_400s_naming_their_parameter(served, body, param):
    _, url = served
    r = httpx.post(url + "/chat/completions", timeout=30,
                   json={"model": "m", "messages": ASK, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
