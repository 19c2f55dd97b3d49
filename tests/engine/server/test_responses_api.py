"""OpenAI's Responses API on a real `hearth serve`, through the `openai` SDK's responses.create
and responses.stream: a greedy response equals the chat-completions answer to the same
conversation, streamed events reassemble to the whole response, previous_response_id continues
a conversation (or is a clear 400), tools get what the chat route gives them, errors in OpenAI's
shape, a client that leaves mid-stream frees its place, and clients of every route at once.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.engine.server.conftest import API_KEY, keyed_hearth_serve, metric, wait_idle

INSTRUCTIONS = "Answer briefly."
QUESTION = "What does `locale.getlocale` do?"
QUESTIONS = ("What does `locale.getlocale` do?", "How do I read a zip file in Python?")


@pytest.fixture(scope="module")
def url():
    with keyed_hearth_serve() as base:
        yield base


def client(url: str, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60)


def chat(url: str, messages: list[dict], **kw):
    return client(url).chat.completions.create(model="demo_model", messages=messages,
                                               temperature=0, **kw)


def ask(**kw) -> dict:
    return dict(model="demo_model", instructions=INSTRUCTIONS, input=QUESTION, temperature=0,
                max_output_tokens=12) | kw


def texts(events) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def test_a_greedy_response_is_the_chat_completions_answer(url):
    reference = chat(url, [{"role": "system", "content": INSTRUCTIONS},
                           {"role": "user", "content": QUESTION}], max_tokens=12)
    answer = client(url).responses.create(**ask())
    assert answer.object == "response" and answer.output_text == \
        reference.choices[0].message.content
    assert answer.status == {"stop": "completed", "length": "incomplete"}[
        reference.choices[0].finish_reason]
    assert answer.usage.input_tokens == reference.usage.prompt_tokens
    assert answer.usage.output_tokens == reference.usage.completion_tokens
    # input as items with text parts reads as the same conversation
    items = client(url).responses.create(**ask(instructions=None, input=[
        {"role": "developer", "content": INSTRUCTIONS},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": QUESTION}]}]))
    assert items.output_text == answer.output_text


def test_a_streamed_response_reassembles_to_the_whole_one(url):
    whole = client(url).responses.create(**ask())
    with client(url).responses.stream(**ask()) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == whole.output_text and final.status == whole.status
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    # cut at max_output_tokens: the stream ends in response.incomplete, as the whole one says
    cut = client(url).responses.create(**ask(max_output_tokens=3))
    raw = list(client(url).responses.create(**ask(max_output_tokens=3), stream=True))
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert raw[-1].type == "response.incomplete"
    assert texts(raw) == cut.output_text


def test_previous_response_id_continues_the_conversation(url):
    first = client(url).responses.create(**ask())
    second = client(url).responses.create(**ask(input="And in Python 2?",
                                                previous_response_id=first.id))
    reference = chat(url, [{"role": "system", "content": INSTRUCTIONS},
                           {"role": "user", "content": QUESTION},
                           {"role": "assistant", "content": first.output_text},
                           {"role": "user", "content": "And in Python 2?"}], max_tokens=12)
    assert second.output_text == reference.choices[0].message.content
    assert second.previous_response_id == first.id
    with client(url).responses.stream(**ask(input="And in Python 2?",
                                            previous_response_id=first.id)) as stream:
        assert texts(stream) == second.output_text
    unstored = client(url).responses.create(**ask(store=False))
    for unknown in ("resp-never-made", unstored.id):
        with pytest.raises(openai.BadRequestError) as e:
            client(url).responses.create(**ask(previous_response_id=unknown))
        assert e.value.param == "previous_response_id"
        assert "not known" in e.value.message


def test_tools_get_what_the_chat_route_gives_them(url):
    """Function tools go through one adapter to the chat route's shape: refused there, refused
    here with the same 400; served there, served here as function_call items."""
    question = "What is the weather in Paris?"
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    try:
        reference = chat(url, [{"role": "user", "content": question}], max_tokens=24, tools=[
            {"type": "function", "function": {"name": "get_weather", "parameters": parameters}}])
    except openai.BadRequestError as refused:
        with pytest.raises(openai.BadRequestError) as e:
            client(url).responses.create(**ask(instructions=None, input=question, tools=[
                {"type": "function", "name": "get_weather", "parameters": parameters}]))
        assert (e.value.message, e.value.param) == (refused.message, refused.param)
        return
    answer = client(url).responses.create(**ask(instructions=None, input=question, tools=[
        {"type": "function", "name": "get_weather", "parameters": parameters}]))
    assert [(i.name, i.call_id) for i in answer.output if i.type == "function_call"] == \
        [(c.function.name, c.id) for c in reference.choices[0].message.tool_calls or []]


def test_errors_come_in_openais_shape(url):
    with pytest.raises(openai.AuthenticationError):
        client(url, "wrong").responses.create(**ask())
    with pytest.raises(openai.BadRequestError) as e:
        client(url).responses.create(**ask(input="word " * 2000))
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client(url).responses.create(**ask(temperature=3))
    assert e.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client(url).responses.create(**ask(input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://x/y.png"}]}]))
    assert e.value.param == "input" and "input_image" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client(url).responses.create(**ask(model="gpt-5"))


def test_a_client_that_leaves_mid_stream_frees_its_place(url):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    before = metric(url, "hearth_tokens_generated_total", headers)
    with client(url).responses.stream(**ask(max_output_tokens=990),
                                      extra_body={"ignore_eos": True}) as stream:
        deltas = 0
        for event in stream:
            deltas += event.type == "response.output_text.delta"
            if deltas == 10:
                break
    wait_idle(url)
    assert metric(url, "hearth_tokens_generated_total", headers) - before < 990


def test_eight_clients_of_every_route_at_once_lose_nothing(url):
    anthropic = pytest.importorskip("anthropic")
    references = {q: chat(url, [{"role": "user", "content": q}], max_tokens=12)
                  .choices[0].message.content for q in QUESTIONS}

    async def one(i: int) -> tuple[str, str]:
        q, route = QUESTIONS[i % 2], i % 4
        oa = openai.AsyncOpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=120)
        an = anthropic.AsyncAnthropic(base_url=url.removesuffix("/v1"), api_key=API_KEY,
                                      max_retries=0, timeout=120)
        messages = [{"role": "user", "content": q}]
        streamed = i >= 4
        if route == 0:
            answer = await oa.chat.completions.create(model="demo_model", messages=messages,
                                                      temperature=0, max_tokens=12)
            text = answer.choices[0].message.content
        elif route == 1:
            ask_it = dict(model="demo_model", messages=messages, max_tokens=12,
                          extra_body={"temperature": 0})
            if streamed:
                async with an.messages.stream(**ask_it) as stream:
                    text = "".join([t async for t in stream.text_stream])
            else:
                text = (await an.messages.create(**ask_it)).content[0].text
        else:
            ask_it = dict(model="demo_model", input=q, temperature=0, max_output_tokens=12)
            if streamed:
                async with oa.responses.stream(**ask_it) as stream:
                    text = (await stream.get_final_response()).output_text
            else:
                text = (await oa.responses.create(**ask_it)).output_text
        await oa.close()
        await an.close()
        return q, text

    async def main():
        return await asyncio.gather(*(one(i) for i in range(8)))

    results = asyncio.run(main())
    assert len(results) == 8
    assert [(q, t) for q, t in results if t != references[q]] == []
