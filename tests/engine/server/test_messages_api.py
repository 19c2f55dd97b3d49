"""Anthropic's Messages API on a real `hearth serve`, through the official `anthropic` SDK: a
greedy message equals the chat-completions answer to the same conversation, streamed events
reassemble to the whole message, count_tokens, stop sequences, tools refused as the chat route
refuses them, errors in Anthropic's shape, and a client that leaves mid-stream frees its place.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from engine.events.server_routes import SERVER_ROUTES
from tests.engine.server.conftest import API_KEY, keyed_hearth_serve, metric, wait_idle

anthropic = pytest.importorskip("anthropic")

SYSTEM = "Answer briefly."
QUESTION = "What does `locale.getlocale` do?"
GREEDY = {"temperature": 0}  # this SDK version sends sampling settings only as extra_body
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


@pytest.fixture(scope="module")
def url():
    with keyed_hearth_serve() as base:
        yield base


def claude(url: str, key: str = API_KEY):
    return anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key=key, max_retries=0,
                               timeout=60)


def chat(url: str, messages: list[dict], **kw):
    c = openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=60)
    return c.chat.completions.create(model="demo_model", messages=messages, temperature=0, **kw)


def test_a_greedy_message_is_the_chat_completions_answer(url):
    reference = chat(url, [{"role": "system", "content": SYSTEM},
                           {"role": "user", "content": QUESTION}], max_tokens=12)
    answer = claude(url).messages.create(model="demo_model", system=SYSTEM, max_tokens=12,
                                         messages=[{"role": "user", "content": QUESTION}],
                                         extra_body=GREEDY)
    assert answer.type == "message" and answer.role == "assistant"
    assert [b.type for b in answer.content] == ["text"]
    assert answer.content[0].text == reference.choices[0].message.content
    assert answer.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[
        reference.choices[0].finish_reason]
    assert answer.usage.input_tokens == reference.usage.prompt_tokens
    assert answer.usage.output_tokens == reference.usage.completion_tokens
    # system and content as text blocks read as the same strings
    blocks = claude(url).messages.create(
        model="demo_model", max_tokens=12, extra_body=GREEDY,
        system=[{"type": "text", "text": SYSTEM}],
        messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}]}])
    assert blocks.content[0].text == answer.content[0].text
    counted = claude(url).messages.count_tokens(model="demo_model", system=SYSTEM,
                                                messages=[{"role": "user", "content": QUESTION}])
    assert counted.input_tokens == answer.usage.input_tokens


def test_a_streamed_message_reassembles_to_the_whole_one_in_anthropics_event_order(url):
    ask = dict(model="demo_model", system=SYSTEM, max_tokens=16, extra_body=GREEDY,
               messages=[{"role": "user", "content": QUESTION}])
    whole = claude(url).messages.create(**ask)
    with claude(url).messages.stream(**ask) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason,
                                                              whole.usage.output_tokens)
    assert final.usage.input_tokens == whole.usage.input_tokens
    raw = [e.type for e in claude(url).messages.create(**ask, stream=True)]
    assert raw[:2] == ["message_start", "content_block_start"]
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) == {"content_block_delta"}
    assert "text" in kinds  # the SDK's helper saw the text deltas


def test_stop_sequences_end_the_answer_as_the_chat_routes_stop_does(url):
    messages = [{"role": "user", "content": QUESTION}]
    free = chat(url, messages, max_tokens=12).choices[0].message.content
    stop = free.split()[2]  # a word the greedy answer says
    reference = chat(url, messages, max_tokens=12, stop=[stop])
    answer = claude(url).messages.create(model="demo_model", max_tokens=12, messages=messages,
                                         stop_sequences=[stop], extra_body=GREEDY)
    assert answer.content[0].text == reference.choices[0].message.content
    assert answer.stop_reason == "stop_sequence" and answer.stop_sequence == stop


def test_tools_get_what_the_chat_route_gives_them(url):
    """Tools go through one adapter to the chat route's shape: refused there, refused here (a
    400 in Anthropic's shape); served there, served here as tool_use blocks."""
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    function = {"type": "function", "function": {"name": WEATHER["name"],
                                                 "description": WEATHER["description"],
                                                 "parameters": WEATHER["input_schema"]}}
    try:
        reference = chat(url, question, max_tokens=24, tools=[function])
    except openai.BadRequestError as refused:
        with pytest.raises(anthropic.BadRequestError) as e:
            claude(url).messages.create(model="demo_model", max_tokens=24, messages=question,
                                        tools=[WEATHER], extra_body=GREEDY)
        assert e.value.body == {"type": "error", "error": {
            "type": "invalid_request_error", "message": refused.body["message"]}}
        return
    answer = claude(url).messages.create(model="demo_model", max_tokens=24, messages=question,
                                         tools=[WEATHER], extra_body=GREEDY)
    calls = reference.choices[0].message.tool_calls or []
    assert [(b.name, b.id) for b in answer.content if b.type == "tool_use"] == \
        [(c.function.name, c.id) for c in calls]


def test_errors_come_in_anthropics_shape(url):
    def refused(error_class, client, **kw):
        ask = dict(model="demo_model", max_tokens=8,
                   messages=[{"role": "user", "content": QUESTION}]) | kw
        with pytest.raises(error_class) as e:
            client.messages.create(**ask)
        assert e.value.body["type"] == "error" and e.value.body["error"]["message"]
        return e.value.body["error"]

    assert refused(anthropic.AuthenticationError, claude(url, "wrong"))["type"] == \
        "authentication_error"
    too_long = refused(anthropic.BadRequestError, claude(url),
                       messages=[{"role": "user", "content": "word " * 2000}])
    assert too_long["type"] == "invalid_request_error" and "context" in too_long["message"]
    assert "temperature" in refused(anthropic.BadRequestError, claude(url),
                                    extra_body={"temperature": 1.5})["message"]
    assert "image" in refused(anthropic.BadRequestError, claude(url), messages=[
        {"role": "user", "content": [{"type": "image", "source": {"type": "url",
                                                                   "url": "http://x/y.png"}}]}
    ])["message"]
    assert refused(anthropic.NotFoundError, claude(url), model="claude-x")["type"] == \
        "not_found_error"
    # a missing field, answered as the SDK would never send it: in the same shape
    r = httpx.post(url + "/messages", headers={"x-api-key": API_KEY}, timeout=60,
                   json={"model": "demo_model", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"]
    # the guards in front of every route answer in the route's protocol too
    r = httpx.post(url + "/messages", headers={"x-api-key": API_KEY, "Host": "evil.example"},
                   json={}, timeout=60)
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    r = httpx.post(url + "/messages", headers={"x-api-key": API_KEY}, timeout=60,
                   content=b"x" * (2 << 20))
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"


def test_every_listed_route_is_served(url):
    served = httpx.get(url.removesuffix("/v1") + "/openapi.json", timeout=60,
                       headers={"x-api-key": API_KEY}).json()["paths"]
    assert {p for _, paths in SERVER_ROUTES for p in paths} <= set(served)


def test_a_client_that_leaves_mid_stream_frees_its_place(url):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    before = metric(url, "hearth_tokens_generated_total", headers)
    with claude(url).messages.stream(
            model="demo_model", max_tokens=1000, messages=[{"role": "user", "content": "Hi"}],
            extra_body={"temperature": 0, "ignore_eos": True}) as stream:
        for n, _ in enumerate(stream.text_stream):
            if n == 10:
                break
    wait_idle(url)  # its request stops at the next step once the connection is gone
    assert metric(url, "hearth_tokens_generated_total", headers) - before < 1000
