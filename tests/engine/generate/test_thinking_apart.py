"""A chat request's thinking apart from its answer (GenerateRequest.thinking): on the tiny model
that thinks (tests/fixtures/tool_model.py), its Token events carry the thinking in `reasoning`
and the answer alone in `text`, alone and in a batch of several; `enabled` false reaches the chat
template as enable_thinking; a request without it streams the text as it was; the Loaded event
says the model thinks and can stop; the JSON lines carry both ways."""

from __future__ import annotations

import pytest

from engine.answer.reasoning import ReasoningReader
from engine.events import (
    Finished,
    GenerateRequest,
    LoadRequest,
    SamplingParams,
    ThinkingSpec,
    Token,
    event_from_json,
    event_to_json,
    request_from_json,
    request_to_json,
)
from engine.generate.session import Session
from engine.step.sampling import Sampler
from tests.engine.generate.test_batch_run import Run
from tests.fixtures import tool_model

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/engine/conftest.py

ANSWER = tool_model.THINKING_ANSWER.split("</think>", 1)[1]  # the content after the thinking


def ask(thinking: ThinkingSpec | None) -> GenerateRequest:
    return GenerateRequest(messages=({"role": "user", "content": "Weather in Paris?"},),
                           max_new_tokens=64, sampling=SamplingParams(temperature=0.0),
                           thinking=thinking)


def parts(events) -> tuple[str, str, str]:
    tokens = [e for e in events if isinstance(e, Token)]
    assert isinstance(events[-1], Finished) and events[-1].reason == "eos", events[-1]
    return ("".join(t.reasoning for t in tokens), "".join(t.text for t in tokens),
            events[-1].reason)


@pytest.fixture(scope="module")
def session(tiny_models, tmp_path_factory):
    folder = tool_model.build(tiny_models["llama"], tmp_path_factory.mktemp("think") / "m")
    return Session.load(LoadRequest(str(folder), device="cpu"))


def test_the_thinking_comes_apart_alone_and_in_a_batch(session):
    reasoning, text, _ = parts(list(session.generate(ask(ThinkingSpec()))))
    assert reasoning == tool_model.THINKING and text == ANSWER
    run = Run(session)
    try:
        for i in range(3):  # together: each row its own reader
            run.submit(f"r{i}", ask(ThinkingSpec()))
        for i in range(3):
            run.wait(f"r{i}")
            assert parts(run.events[f"r{i}"])[:2] == (tool_model.THINKING, ANSWER)
    finally:
        run.close()


def test_thinking_off_reaches_the_template_and_none_keeps_the_text_whole(session):
    reasoning, text, _ = parts(list(session.generate(ask(ThinkingSpec(enabled=False)))))
    assert (reasoning, text) == ("", tool_model.PLAIN_ANSWER)
    reasoning, text, _ = parts(list(session.generate(ask(None))))
    assert (reasoning, text) == ("", tool_model.THINKING_ANSWER)


def test_the_load_event_says_the_model_thinks_and_can_stop(session):
    event = session.loaded_event()
    assert event.thinks and event.can_stop_thinking


def test_held_back_text_goes_out_with_the_last_token():
    """A thinking cut at its token limit inside a partial close tag: the last token flushes it."""
    sampler = Sampler.__new__(Sampler)  # the token path alone: no device state needed
    sampler.logprobs, sampler.reading = None, ReasoningReader()
    first = sampler.token("<think>why", (1,))
    last = sampler.token(" </thi", (2,), last=True)
    assert (first.reasoning + last.reasoning, first.text + last.text) == ("why </thi", "")


def test_the_json_lines_carry_thinking_and_reasoning():
    req = ask(ThinkingSpec(enabled=False))
    assert request_from_json(request_to_json(req)) == req
    assert request_from_json(request_to_json(ask(None))).thinking is None
    token = Token("", (3,), reasoning="hmm")
    assert event_from_json(event_to_json(token)) == token
    assert "reasoning" not in event_to_json(Token("a", (3,)))  # the line as it was
