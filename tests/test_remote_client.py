"""engine/remote against the fake endpoint (tests/fake_endpoint.py): the events of a streamed
answer, each failure as one Failed, a stop that unblocks a stalled read, and `hearth run
--endpoint` in-process (exit codes 0/2/1, --json events, one sentence on stderr)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from engine.cli import cli
from engine.events import (
    BadRequest,
    Failed,
    Finished,
    GenerateRequest,
    GrammarSpec,
    Stats,
    ThinkingSpec,
    Token,
)
from engine.remote import (
    CancelToken,
    chat_body,
    list_models,
    mask,
    parse_base_url,
    stream_chat,
)
from engine.remote.answer_stream import AnswerStream
from engine.remote.sse import ServerEvent
from tests.fake_endpoint import ANSWER, FLOOD_CAP_BYTES, FakeEndpoint, closed_port_url

KEY = "sk-test-0123456789abcdefXYZ"
HI = GenerateRequest(messages=({"role": "user", "content": "hi there"},), system="be brief")


@pytest.fixture
def endpoint():
    with FakeEndpoint(api_key=KEY, contexts={"fake-7b": 8192}) as fake:
        yield fake


def terminal(events: list):
    """The stream's one terminal event, checked to be its last and only one."""
    ends = [e for e in events if isinstance(e, (Finished, Failed))]
    assert len(ends) == 1 and events[-1] is ends[0], events
    return ends[0]


def text_of(events: list) -> str:
    return "".join(e.text for e in events if isinstance(e, Token))


def test_models_are_listed_with_their_context(endpoint):
    models = list_models(endpoint.base_url, KEY)
    assert [(m.id, m.context) for m in models] == [("fake-7b", 8192), ("fake-70b", 0)]
    assert endpoint.requests[-1]["headers"]["Authorization"] == f"Bearer {KEY}"


def test_an_answer_streams_as_tokens_then_finished(endpoint):
    events = list(stream_chat(endpoint.base_url, "fake-7b", HI, api_key=KEY))
    end = terminal(events)
    assert text_of(events) == "".join(ANSWER)
    assert isinstance(end, Finished) and end.reason == "eos"
    # counts from the usage chunk; speeds measured from the stream
    assert end.stats.new_tokens == len(ANSWER)
    assert end.stats.prompt_tokens == 2 + 2 + 5  # the fake counts words, plus 5
    assert end.stats.context_used_tokens == end.stats.prompt_tokens + len(ANSWER)
    assert end.stats.ttft_ms > 0 and end.stats.decode_tokens_per_s > 0
    assert any(isinstance(e, Stats) for e in events[:-1])
    [body] = endpoint.chat_requests
    assert body["messages"] == [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "hi there"}]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_max_tokens_ends_as_max_tokens(endpoint):
    events = list(stream_chat(endpoint.base_url, "fake-7b",
                              GenerateRequest(prompt="hi", max_new_tokens=4), api_key=KEY))
    assert terminal(events).reason == "max_tokens"
    assert text_of(events) == "".join(ANSWER[:4])


def test_sampling_is_sent_only_where_chosen():
    body = chat_body("m", GenerateRequest(prompt="x", stop=("END",)))
    assert "temperature" not in body and "top_k" not in body and body["stop"] == ["END"]
    with pytest.raises(BadRequest):
        chat_body("m", GenerateRequest(prompt_ids=(1, 2)))


def test_an_output_schema_and_the_think_toggle_go_as_openai_and_vllm_take_them():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = chat_body("m", GenerateRequest(prompt="x", grammar=GrammarSpec.from_schema(schema),
                                          thinking=ThinkingSpec(enabled=False)))
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "answer", "schema": schema, "strict": True}}
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    body = chat_body("m", GenerateRequest(prompt="x", thinking=ThinkingSpec()))
    assert "chat_template_kwargs" not in body and "response_format" not in body
    with pytest.raises(BadRequest):
        chat_body("m", GenerateRequest(prompt="x", grammar=GrammarSpec("regex", "a+")))


@pytest.mark.parametrize("key, words", [("wrong-key", "refused the API key"),
                                        (None, "needs an API key")])
def test_a_wrong_or_missing_key_is_one_failed(endpoint, key, words):
    end = terminal(list(stream_chat(endpoint.base_url, "fake-7b", HI, api_key=key)))
    assert isinstance(end, Failed) and words in end.error and end.bad_input
    assert "wrong-key" not in end.error  # the server echoed it; the message does not


def test_a_vanished_model_is_one_failed(endpoint):
    endpoint.models.remove("fake-7b")
    end = terminal(list(stream_chat(endpoint.base_url, "fake-7b", HI, api_key=KEY)))
    assert isinstance(end, Failed) and "does not serve the model fake-7b" in end.error


def test_an_unreachable_endpoint_is_one_failed():
    events = list(stream_chat(closed_port_url(), "fake-7b", HI))
    end = terminal(events)
    assert isinstance(end, Failed) and "Cannot reach" in end.error and "refused" in end.error


@pytest.mark.parametrize("mode, words", [("cut", "was cut mid-answer"),
                                         ("error_chunk", "CUDA out of memory on worker 3")])
def test_a_stream_that_breaks_keeps_its_partial_answer(mode, words):
    with FakeEndpoint(mode=mode, fail_after=3) as fake:
        events = list(stream_chat(fake.base_url, "fake-7b", HI))
    end = terminal(events)
    assert isinstance(end, Failed) and words in end.error and "kept" in end.hint
    assert text_of(events) == "".join(ANSWER[:3])


def test_cancel_unblocks_a_stalled_stream_at_once():
    cancel = CancelToken()
    with FakeEndpoint(mode="stall") as fake:
        threading.Timer(0.3, cancel.cancel).start()
        t0 = time.monotonic()
        events = list(stream_chat(fake.base_url, "fake-7b", HI, cancel=cancel))
        elapsed = time.monotonic() - t0
    assert terminal(events).reason == "cancelled"
    assert elapsed < 2.0  # the read timeout is minutes: the cancel closed the socket


def test_reasoning_deltas_arrive_apart_from_the_content():
    stream = AnswerStream("host:1", time.monotonic())
    out = []
    for delta, finish in (({"role": "assistant", "content": ""}, None),
                          ({"reasoning_content": "hmm"}, None), ({"content": "Yes."}, None),
                          ({}, "stop")):
        chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        out += stream.feed(ServerEvent("message", json.dumps(chunk)), time.monotonic())
    out += stream.end()
    assert text_of(out) == "Yes."
    assert "".join(e.reasoning for e in out if isinstance(e, Token)) == "hmm"
    assert isinstance(out[-1], Finished) and out[-1].reason == "eos"


def test_an_eof_without_finish_is_a_cut():
    stream = AnswerStream("host:1", time.monotonic())
    chunk = {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]}
    stream.feed(ServerEvent("message", json.dumps(chunk)), time.monotonic())
    [end] = stream.end()
    assert isinstance(end, Failed) and "cut mid-answer" in end.error


@pytest.mark.parametrize("url, normal", [("gpu-box:8000/v1/", "http://gpu-box:8000/v1"),
                                         ("https://api.example.com/v1/chat/completions",
                                          "https://api.example.com/v1"),
                                         ("http://[::1]:8000/v1", "http://[::1]:8000/v1")])
def test_base_urls_are_normalized(url, normal):
    assert parse_base_url(url).text == normal


@pytest.mark.parametrize("url, words", [("ftp://x/v1", "http:// or https://"),
                                        ("http://user:sk-1@host/v1", "own field"),
                                        ("http://host/v1?x=1", "base URL"), ("", "base URL")])
def test_bad_base_urls_are_one_sentence(url, words):
    with pytest.raises(BadRequest, match=words):
        parse_base_url(url)


def test_a_key_is_shown_masked():
    assert KEY not in mask(KEY) and mask(KEY).endswith(KEY[-4:])
    assert mask("short") == "••••••••"


# ---------------------------------------------------------------- hearth run --endpoint


def run(capsys, *flags: str) -> tuple[int, str, str]:
    rc = cli.main(["run", *flags])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def test_run_endpoint_prints_the_answer(endpoint, capsys):
    rc, out, err = run(capsys, "--endpoint", endpoint.base_url, "--api-key", KEY, "--model",
                       "fake-7b", "--prompt", "hi")
    assert rc == 0
    assert out.strip() == "".join(ANSWER)
    assert "[eos] 11 tokens" in err and KEY not in out + err


def test_run_endpoint_json_events_and_env_key(endpoint, capsys, monkeypatch):
    monkeypatch.setenv("HEARTH_API_KEY", KEY)
    rc, out, _ = run(capsys, "--endpoint", endpoint.base_url, "--model", "fake-7b",
                     "--prompt", "hi", "--json", "--max-new-tokens", "2")
    events = [json.loads(line) for line in out.splitlines()]
    assert rc == 0
    assert [e["event"] for e in events if e["event"] != "stats"] == ["token", "token",
                                                                      "finished"]
    assert events[0] == {"event": "token", "text": "Hello", "token_ids": []}
    assert events[-1]["reason"] == "max_tokens" and events[-1]["stats"]["new_tokens"] == 2


@pytest.mark.parametrize("flags, code, words", [
    (["--api-key", "wrong-key", "--model", "fake-7b"], 2, "refused the API key"),
    (["--api-key", KEY, "--model", "gpt-5"], 2, "serves fake-7b, fake-70b"),
    (["--api-key", KEY], 2, "--endpoint needs --model"),
    (["--api-key", KEY, "--model", "fake-7b", "--quant", "nf4"], 2, "--quant shapes a local"),
    (["--api-key", KEY, "--model", "fake-7b", "--prompt-lookup"], 2, "--prompt-lookup"),
    (["--api-key", "two words", "--model", "fake-7b"], 2, "printable ASCII"),
])
def test_run_endpoint_bad_input_is_one_line_exit_2(endpoint, capsys, flags, code, words):
    rc, out, err = run(capsys, "--endpoint", endpoint.base_url, "--prompt", "hi", *flags)
    assert rc == code
    [line] = err.strip().splitlines()
    assert words in line and "wrong-key" not in line


def test_run_endpoint_unreachable_exits_1(capsys):
    rc, out, err = run(capsys, "--endpoint", closed_port_url(), "--model", "m", "--prompt", "x")
    assert rc == 1 and out == ""
    [line] = err.strip().splitlines()
    assert "Cannot reach the endpoint" in line


def test_run_endpoint_cut_keeps_the_partial_answer_exits_1(capsys):
    with FakeEndpoint(mode="cut", fail_after=2) as fake:
        rc, out, err = run(capsys, "--endpoint", fake.base_url, "--model", "fake-7b",
                           "--prompt", "hi")
    assert rc == 1
    assert out.strip() == "Hello!"
    assert "cut mid-answer" in err.strip().splitlines()[-1]


# ---------------------------------------------------------------- a hostile endpoint


@pytest.mark.parametrize("mode, words", [("long_line", "a line longer than 1 MiB"),
                                         ("long_event", "an event longer than 1 MiB")])
def test_an_endless_line_or_event_ends_the_answer_in_one_line(capsys, mode, words):
    """The endpoint sends two deltas, then a line or an event that never ends: the client
    stops reading at its bound, keeps the two deltas and says why in one line."""
    with FakeEndpoint(mode=mode, fail_after=2) as fake:
        rc, out, err = run(capsys, "--endpoint", fake.base_url, "--model", "fake-7b",
                           "--prompt", "hi")
        sent = fake.sent_bytes
    assert rc == 1
    assert out.strip() == "Hello!"  # the partial answer stays
    [line] = [ln for ln in err.strip().splitlines() if not ln.startswith("streaming ")]
    assert words in line and "the answer stops there" in line
    # the flood went on while it was read: the client stopped a few MiB in, not at its end
    assert sent < FLOOD_CAP_BYTES // 4


def test_an_endless_answer_stops_at_max_new_tokens(capsys):
    with FakeEndpoint(mode="endless") as fake:
        rc, out, err = run(capsys, "--endpoint", fake.base_url, "--model", "fake-7b",
                           "--prompt", "hi", "--max-new-tokens", "8")
        sent = fake.sent_bytes
        [body] = fake.chat_requests
    assert rc == 0
    assert out.strip() == "again" + " again" * 7  # eight deltas, and no more
    assert "[max_tokens] 8 tokens" in err
    assert body["max_tokens"] == 8  # the limit is sent too
    assert sent < FLOOD_CAP_BYTES // 4
