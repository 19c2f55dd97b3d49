"""The grammar's targets through a real `hearth serve` and the `openai` SDK on a random-weights
tiny model (the tests' tiny Qwen2: whatever it writes unconstrained is never a valid call or
object): under tool_choice required and a named function every call parses and validates against
its function's parameters; over the five schemas of bench/structured_output.py, a few seeded
requests each finish `stop` and validate. Seeded requests answer alike in any batch, so these
are fixed outcomes, not samples."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from engine.tools.bench import structured
from tests.engine.helpers import hearth_serve

PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in structured.TOOLS}


@pytest.fixture(scope="module")
def url(tiny_models):
    proc, url = hearth_serve("--model", str(tiny_models["qwen2"]))
    yield url
    proc.terminate()
    proc.wait(30)


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)


def ask(client, **kw):
    return client.chat.completions.create(
        model=client.models.list().data[0].id, temperature=1.0, max_tokens=256,
        messages=[{"role": "user", "content": structured.TOOL_ASK}], tools=structured.TOOLS,
        **kw)


@pytest.mark.parametrize("choice", structured.CHOICES,
                         ids=["required", *(f"named-{n}" for n in PARAMS)])
def test_every_call_validates_against_its_functions_parameters(client, choice):
    for seed, parallel in ((1, True), (2, False)):
        answer = ask(client, tool_choice=choice, seed=seed, parallel_tool_calls=parallel)
        (only,) = answer.choices
        assert only.finish_reason == "tool_calls", only
        calls = only.message.tool_calls
        assert calls and (parallel or len(calls) == 1)
        for call in calls:
            if isinstance(choice, dict):
                assert call.function.name == choice["function"]["name"]
            jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_a_streamed_forced_call_equals_the_whole_one(client):
    whole = ask(client, tool_choice="required", seed=3).choices[0].message.tool_calls
    chunks = list(ask(client, tool_choice="required", seed=3, stream=True))
    args: dict[int, str] = {}
    names = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            names.setdefault(d.index, d.function.name)
            args[d.index] = args.get(d.index, "") + (d.function.arguments or "")
    assert [(names[i], args[i]) for i in sorted(args)] == [
        (c.function.name, c.function.arguments) for c in whole]


def test_five_schemas_answer_to_their_schema(url):
    rows = structured.run_schemas(url, len(structured.SCHEMAS), max_tokens=512, workers=2)
    assert sorted(r["schema"] for r in rows) == sorted(structured.SCHEMAS)
    for r in rows:
        assert r["finish"] == "stop" and r["valid"], r
        jsonschema.validate(json.loads(r["text"]), structured.SCHEMAS[r["schema"]])


def test_a_template_without_tool_calls_reads_a_history_of_calls_as_text(client):
    """This model's template renders only `content`: an assistant turn of calls alone (content
    null) goes in as the calls written out, and the conversation goes on (it was the template's
    error, a 400)."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [{"role": "user", "content": structured.TOOL_ASK},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18 C, clear"}]
    written = [*history[:1], {"role": "assistant", "content": '<tool_call>{"name": '
                              '"get_weather", "arguments": {"city": "Paris"}}</tool_call>'},
               history[2]]
    answers = [client.chat.completions.create(
        model=client.models.list().data[0].id, messages=m, tools=structured.TOOLS,
        tool_choice="none", max_tokens=4, temperature=0) for m in (history, written)]
    assert answers[0].usage.prompt_tokens == answers[1].usage.prompt_tokens
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content
