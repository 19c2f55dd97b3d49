"""The official `openai` SDK, sync and async, streamed and not, against the server as it is:
chat.completions, completions and models, and its exception classes for bad requests."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.engine.server.conftest import API_KEY

QUESTION = [{"role": "user", "content": "What does `locale.getlocale` do?"}]


def client(srv, key: str = "unused", **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url, api_key=key, max_retries=0, timeout=60, **kw)


def test_models_list_names_the_loaded_model_by_its_folder_name(server):
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["demo_model"]
    assert models.data[0].object == "model" and models.data[0].owned_by == "hearth"
    assert client(server).models.retrieve("demo_model").id == "demo_model"


def test_chat_streamed_and_not_give_the_same_greedy_text(server):
    c = client(server)
    whole = c.chat.completions.create(model="demo_model", messages=QUESTION, temperature=0,
                                      max_tokens=12)
    text = whole.choices[0].message.content
    assert text and whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens <= 12 and whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    chunks = list(c.chat.completions.create(model="demo_model", messages=QUESTION,
                                            temperature=0, max_tokens=12, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_developer_role_and_text_parts_read_as_system_and_plain_text(server):
    c = client(server)
    plain = c.chat.completions.create(
        model="demo_model", temperature=0, max_tokens=8,
        messages=[{"role": "system", "content": "Answer briefly."}, *QUESTION])
    parts = c.chat.completions.create(
        model="demo_model", temperature=0, max_tokens=8,
        messages=[{"role": "developer", "content": [{"type": "text", "text": "Answer briefly."}]},
                  {"role": "user", "content": [{"type": "text", "text": QUESTION[0]["content"]}]}])
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens


def test_completions_raw_prompt_streamed_and_not(server):
    c = client(server)
    whole = c.completions.create(model="demo_model", prompt="def getlocale(", temperature=0,
                                 max_tokens=10)
    assert whole.object == "text_completion" and whole.choices[0].text
    assert whole.usage.completion_tokens <= 10
    streamed = list(c.completions.create(model="demo_model", prompt="def getlocale(",
                                         temperature=0, max_tokens=10, stream=True))
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == whole.choices[0].text


def test_n_choices_and_a_full_path_as_the_model_id(server, engine):
    path = str(engine.session.lm.folder.path)
    answer = client(server).chat.completions.create(model=path, messages=QUESTION, n=3,
                                                    temperature=0, max_tokens=6)
    assert [ch.index for ch in answer.choices] == [0, 1, 2]
    assert len({ch.message.content for ch in answer.choices}) == 1  # greedy: all the same
    assert answer.model == path  # answered under the id it was asked by


def test_async_client_streamed_and_not(server):
    async def main():
        c = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=60)
        whole = await c.chat.completions.create(model="demo_model", messages=QUESTION,
                                                temperature=0, max_tokens=8)
        stream = await c.chat.completions.create(model="demo_model", messages=QUESTION,
                                                 temperature=0, max_tokens=8, stream=True)
        text = "".join([ch.choices[0].delta.content or "" async for ch in stream
                        if ch.choices])
        done = await c.completions.create(model="demo_model", prompt="import os", max_tokens=4,
                                          temperature=0)
        models = await c.models.list()
        await c.close()
        return whole, text, done, models

    whole, text, done, models = asyncio.run(main())
    assert text == whole.choices[0].message.content
    assert done.choices[0].finish_reason in ("stop", "length")
    assert models.data[0].id == "demo_model"


def test_bad_requests_raise_the_sdks_matching_exceptions(server, keyed):
    c = client(server)
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="demo_model", messages=QUESTION, presence_penalty=2.5)
    assert e.value.param == "presence_penalty"
    long = [{"role": "user", "content": "word " * 2000}]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="demo_model", messages=long, stream=True)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.AuthenticationError):
        client(keyed, key="wrong").models.list()
    assert client(keyed, key=API_KEY).models.list().data[0].id == "demo_model"
