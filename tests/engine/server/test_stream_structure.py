"""The raw server-sent events, chunk by chunk (as llama.cpp's server tests check them): role in
the first delta, one id across chunks, the last choice chunk with a finish_reason and no content,
the include_usage chunk, `usage: null` elsewhere, `data: [DONE]` last."""

from __future__ import annotations

import json

import httpx

QUESTION = [{"role": "user", "content": "What does `locale.getlocale` do?"}]


def sse(url: str, body: dict) -> list[str]:
    """The `data:` payloads of one streamed answer, in order."""
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: "):] for e in events]


def check_chat_stream(payloads: list[str], include_usage: bool, n: int = 1) -> dict:
    """Every rule of a chat stream; -> {"texts": {index: text}, "finish": {...}, "usage"}."""
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    texts, finish, seen_role = {}, {}, set()
    body = chunks[:-1] if include_usage else chunks
    for c in body:
        assert c["usage"] is None
        (choice,) = c["choices"]
        i = choice["index"]
        assert i not in finish, "a chunk after the choice's finish_reason"
        if i not in seen_role:
            assert choice["delta"].get("role") == "assistant", "the first delta has the role"
            seen_role.add(i)
        else:
            assert "role" not in choice["delta"]
        if choice["finish_reason"] is not None:
            assert choice["delta"].get("content") in (None, "")
            finish[i] = choice["finish_reason"]
        texts[i] = texts.get(i, "") + (choice["delta"].get("content") or "")
    assert sorted(finish) == list(range(n)) and set(finish.values()) <= {"stop", "length"}
    usage = None
    if include_usage:
        last = chunks[-1]
        assert last["choices"] == [] and last["usage"]["completion_tokens"] > 0
        usage = last["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    return {"texts": texts, "finish": finish, "usage": usage}


def test_chat_stream_structure_with_usage(server):
    url = server.url + "/chat/completions"
    payloads = sse(url, {"model": "demo_model", "messages": QUESTION, "temperature": 0,
                         "max_tokens": 12, "stream": True,
                         "stream_options": {"include_usage": True}})
    got = check_chat_stream(payloads, include_usage=True)
    whole = httpx.post(url, json={"model": "demo_model", "messages": QUESTION,
                                  "temperature": 0, "max_tokens": 12}, timeout=60).json()
    assert got["texts"][0] == whole["choices"][0]["message"]["content"]
    assert got["usage"] == whole["usage"]
    assert got["finish"][0] == whole["choices"][0]["finish_reason"]


def test_chat_stream_without_usage_has_no_usage_chunk(server):
    payloads = sse(server.url + "/chat/completions",
                   {"model": "demo_model", "messages": QUESTION, "max_tokens": 5,
                    "temperature": 0, "stream": True, "ignore_eos": True})
    got = check_chat_stream(payloads, include_usage=False)
    assert got["finish"] == {0: "length"}  # ignore_eos: runs to max_tokens


def test_chat_stream_with_n_choices(server):
    payloads = sse(server.url + "/chat/completions",
                   {"model": "demo_model", "messages": QUESTION, "max_tokens": 6, "n": 2,
                    "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    got = check_chat_stream(payloads, include_usage=True, n=2)
    assert got["texts"][0] == got["texts"][1]


def test_completion_stream_structure(server):
    payloads = sse(server.url + "/completions",
                   {"model": "demo_model", "prompt": "import os", "max_tokens": 6,
                    "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    assert all(c["object"] == "text_completion" for c in chunks)
    *body, last_choice, usage = chunks
    assert all(c["choices"][0]["finish_reason"] is None and c["usage"] is None for c in body)
    assert last_choice["choices"][0]["finish_reason"] in ("stop", "length")
    assert last_choice["choices"][0]["text"] == ""
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] >= 1
