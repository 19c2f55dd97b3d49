"""The answer readers on strings: each family's call syntax and the thinking split, whole and cut
into stream pieces at every kind of place (the pieces joined must read as the whole does)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.answer.parts import CallArguments, CallStart, Content, Message, Reasoning
from engine.answer.reader import Reading, read_whole
from engine.answer.reasoning import opens_thinking
from engine.answer.tool_syntax import GENERIC, HERMES, LLAMA3, MISTRAL, syntax_for

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, "}"]}}'
# (syntax, thinks, answer, content, reasoning, [(name, arguments)])
CASES = [
    (HERMES, True, f'<think>\nIt asks.\n</think>\n\nChecking.\n<tool_call>\n{WEATHER}\n'
     '</tool_call>\n<tool_call>\n{"arguments": {"x": 1}, "name": "f"}\n</tool_call>',
     "Checking.", "It asks.",
     [("get_weather", '{"city": "Paris", "days": [1, "}"]}'), ("f", '{"x": 1}')]),
    (HERMES, False, "No call here, only <tags> and a < sign.", "No call here, only <tags> and "
     "a < sign.", "", []),
    (HERMES, False, "a <tool_call> not json </tool_call> b", "a <tool_call> not json "
     "</tool_call> b", "", []),
    (LLAMA3, False, '<|python_tag|>{"name": "f", "parameters": {"a": "x;y"}}; '
     '{"name": "g", "parameters": {}}', "", "", [("f", '{"a": "x;y"}'), ("g", "{}")]),
    (LLAMA3, False, '{"name": "f", "parameters": {"a": 1}}', "", "", [("f", '{"a": 1}')]),
    (LLAMA3, False, '{"answer": 42}', '{"answer": 42}', "", []),
    (MISTRAL, False, 'Sure. [TOOL_CALLS] [{"name": "f", "arguments": {"a": "]"}}, '
     '{"name": "g", "arguments": {}}]', "Sure.", "", [("f", '{"a": "]"}'), ("g", "{}")]),
    (MISTRAL, False, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]g[ARGS]{}',
     "", "", [("get_weather", '{"city": "Paris"}'), ("g", "{}")]),
    (MISTRAL, False, "[TOOL_CALLS] is how I call", "[TOOL_CALLS] is how I call", "", []),
    (GENERIC, False, f"{WEATHER}", "", "",
     [("get_weather", '{"city": "Paris", "days": [1, "}"]}')]),
    (GENERIC, True, f"<think>x</think><tool_call>{WEATHER}</tool_call>", "", "x",
     [("get_weather", '{"city": "Paris", "days": [1, "}"]}')]),
]


def _calls(message: Message) -> list[tuple[str, str]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in message.calls or []]


def _streamed(reading: Reading, pieces: list[str]) -> tuple[Message, list]:
    reader, message, parts = reading.reader(), Message(), []
    for piece in pieces:
        parts += reader.feed(piece)
    parts += reader.finish()
    for part in parts:
        message.add(part)
    return message, parts


@pytest.mark.parametrize("syntax, thinks, answer, content, reasoning, calls", CASES)
def test_each_syntax_reads_its_calls_whole(syntax, thinks, answer, content, reasoning, calls):
    message, missing = read_whole(Reading(syntax, thinks), answer)
    assert (message.content, message.reasoning, _calls(message)) == (content, reasoning, calls)
    assert missing is None
    for args in (a for _, a in calls):
        json.loads(args)


@settings(deadline=None, max_examples=60)
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_any_cut_into_stream_pieces_reads_as_the_whole(case, cuts):
    syntax, thinks, answer = case[:3]
    points = sorted({c % (len(answer) + 1) for c in cuts} | {0, len(answer)})
    pieces = [answer[a:b] for a, b in zip(points[:-1], points[1:], strict=True)]
    whole, _ = read_whole(Reading(syntax, thinks), answer)
    streamed, parts = _streamed(Reading(syntax, thinks), pieces)
    assert (streamed.content, streamed.reasoning, _calls(streamed)) == (
        whole.content, whole.reasoning, _calls(whole))
    # OpenAI's order within a call: its start, then argument fragments for it alone
    started = set()
    for part in parts:
        if isinstance(part, CallStart):
            started.add(part.index)
        elif isinstance(part, CallArguments):
            assert part.index in started


def test_a_marker_arriving_in_pieces_is_held_back_not_leaked():
    reader = Reading(HERMES).reader()
    assert reader.feed("Checking. <too") == [Content("Checking.")]
    assert reader.feed("l_ca") == []
    first = reader.feed('ll>{"name": "get_weather", "arguments": {"ci')
    assert isinstance(first[0], CallStart) and first[0].name == "get_weather"
    assert first[1:] == [CallArguments(0, '{"ci')]  # arguments go out as they come
    assert reader.feed('ty": "Paris"}}</tool') == [CallArguments(0, 'ty": "Paris"}')]
    assert reader.feed("_call>") == [] and reader.finish() == []


def test_a_marker_that_never_finishes_is_content_in_the_end():
    reader = Reading(HERMES).reader()
    assert reader.feed("x <tool_ca") == [Content("x")]
    assert reader.finish() == [Content(" <tool_ca")]


def test_a_call_cut_short_by_the_length_stays_a_call():
    message, _ = read_whole(Reading(HERMES), '<tool_call>{"name": "f", "arguments": {"a": "b')
    assert _calls(message) == [("f", '{"a": "b')] and message.content == ""


def test_parallel_tool_calls_false_keeps_the_first_call_only():
    answer = '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g", ' \
             '"arguments": {}}</tool_call>'
    message, _ = read_whole(Reading(HERMES, max_calls=1), answer)
    assert _calls(message) == [("f", "{}")]


def test_call_ids_are_unique_and_mistrals_are_nine_letters_and_digits():
    message, _ = read_whole(Reading(MISTRAL), '[TOOL_CALLS][{"name": "f", "arguments": {}}, '
                            '{"name": "g", "arguments": {}}]')
    ids = [c["id"] for c in message.calls]
    assert len(set(ids)) == 2 and all(len(i) == 9 and i.isalnum() for i in ids)
    message, _ = read_whole(Reading(HERMES), f"<tool_call>{WEATHER}</tool_call>")
    assert message.calls[0]["id"].startswith("call_")


def test_required_and_named_choices_hold_prose_and_name_a_missing_call():
    reader = Reading(HERMES, must_call="").reader()
    assert reader.feed("Sunny today.") == [] and reader.finish() == [Content("Sunny today.")]
    assert "without calling a function" in reader.missing_call()
    _, missing = read_whole(Reading(HERMES, must_call="g"), f"<tool_call>{WEATHER}</tool_call>")
    assert "the function g" in missing
    _, missing = read_whole(Reading(HERMES, must_call="get_weather"),
                            f"<tool_call>{WEATHER}</tool_call>")
    assert missing is None


@pytest.mark.parametrize("template, name", [
    ("{{ '<tool_call>\\n' + tool_call.name }}", "hermes"),
    ("{{- '<|python_tag|>' }}{%- if message.role == 'ipython' %}", "llama3"),
    ("{{ '[TOOL_CALLS] [' }}", "mistral"),
    ("{{ message.content }}", "generic"),
])
def test_the_syntax_is_chosen_from_the_template(template, name):
    assert syntax_for(template).name == name


def test_thinking_opened_by_the_template_is_reasoning_until_it_closes():
    prompt = "<|im_start|>assistant\n<think>\n"
    assert opens_thinking(prompt) and not opens_thinking(prompt + "\n</think>\n\n")
    message, _ = read_whole(Reading(thinks=True, thinking_open=True),
                            "Count: 1, 2.\n</think>\n\nThree.")
    assert (message.reasoning, message.content) == ("Count: 1, 2.", "Three.")


def test_thinking_cut_short_stays_reasoning_and_no_thinking_is_all_content():
    reader = Reading(thinks=True).reader()
    parts = reader.feed("<think>Still going") + reader.finish()
    assert parts == [Reasoning("Still going")]
    message, _ = read_whole(Reading(thinks=True), "  No thinking <think> here.")
    assert (message.reasoning, message.content) == ("", "  No thinking <think> here.")
