"""response_format on the OpenAI routes: json_schema (strict or not) and json_object on chat and
completions hold the answer to the schema; a schema that does not compile, or a malformed
response_format, is a 400 in OpenAI's error shape with the reason (the server keeps serving);
and the `openai` SDK's chat.completions.parse(response_format=PydanticModel) against a real
`hearth serve` subprocess gets its model back."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.engine.helpers import hearth_serve

QUESTION = [{"role": "user", "content": "Describe a fruit as JSON."}]
SCHEMA = {"type": "object", "properties": {
    "fruit": {"enum": ["apple", "pear", "plum"]},
    "weight": {"type": "integer", "minimum": 1, "maximum": 500},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2}},
    "required": ["fruit", "weight", "tags"], "additionalProperties": False}


def schema_format(schema, strict=True) -> dict:
    return {"type": "json_schema",
            "json_schema": {"name": "fruit", "schema": schema, "strict": strict}}


def post(srv, route: str, **body) -> httpx.Response:
    return httpx.post(f"{srv.url}/{route}", json={"model": "demo_model", **body}, timeout=120)


@pytest.mark.parametrize("strict", [True, False])
def test_chat_with_a_json_schema_answers_to_it(server, strict):
    r = post(server, "chat/completions", messages=QUESTION, temperature=0, max_tokens=80,
             response_format=schema_format(SCHEMA, strict))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)


def test_a_streamed_constrained_answer_equals_the_whole_one(server):
    c = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    args = dict(model="demo_model", messages=QUESTION, temperature=0, max_tokens=80,
                response_format=schema_format(SCHEMA))
    whole = c.chat.completions.create(**args).choices[0].message.content
    chunks = list(c.chat.completions.create(stream=True, **args))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == whole
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    jsonschema.validate(json.loads(whole), SCHEMA)


def test_completions_take_json_object_and_json_schema(server):
    r = post(server, "completions", prompt='{"fruit": "apple", "weight": 3} is', temperature=0,
             max_tokens=80, n=2, seed=5, response_format=schema_format(SCHEMA))
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["text"]), SCHEMA)
    r = post(server, "completions", prompt="An object:", temperature=0, max_tokens=60,
             response_format={"type": "json_object"})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    text = choice["text"]
    assert text.startswith("{")
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("fmt, reason", [
    (schema_format({"type": "frog"}), "frog"),
    (schema_format({"properties": {"a": {"type": "string", "pattern": "(("}}}), "unclosed"),
    (schema_format({"$ref": "#/definitions/none"}), "none"),
    ({"type": "xml"}, "not one of text, json_object, json_schema"),
    ({"type": "json_schema"}, "needs a json_schema object"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}, "schema object"),
])
@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_a_bad_response_format_is_a_400_with_the_reason(server, route, fmt, reason):
    body = {"messages": QUESTION} if route == "chat/completions" else {"prompt": "x"}
    r = post(server, route, max_tokens=4, response_format=fmt, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert reason in error["message"] and error["type"] == "invalid_request_error"
    assert error["param"].startswith("response_format")
    assert post(server, route, max_tokens=2, **body).status_code == 200  # still serving


class Fruit(BaseModel):
    fruit: Literal["apple", "pear", "plum"]
    weight: int = Field(ge=1, le=500)
    note: str = Field(max_length=12)


@pytest.fixture(scope="module")
def served():
    proc, url = hearth_serve()
    try:
        yield url
    finally:
        proc.kill()
        proc.wait()


def test_the_sdks_parse_gets_its_pydantic_model_back(served):
    c = openai.OpenAI(base_url=served, api_key="unused", max_retries=0, timeout=300)
    for seed in (None, 7):
        done = c.chat.completions.parse(model="demo_model", messages=QUESTION, temperature=0
                                        if seed is None else 0.8, seed=seed, max_tokens=100,
                                        response_format=Fruit)
        choice = done.choices[0]
        assert choice.finish_reason == "stop"
        parsed = choice.message.parsed
        assert isinstance(parsed, Fruit) and 1 <= parsed.weight <= 500
        assert Fruit.model_validate_json(choice.message.content) == parsed
