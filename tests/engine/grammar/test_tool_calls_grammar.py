"""The grammar of tool_choice, family by family, on the tiny tokenizer with the families' markers
added as tokens (added tokens are special to llguidance, as Qwen's `<tool_call>` is): which
answers it lets through to their end and which it stops, read token by token with the matcher.
Under required and a named function only calls pass (one where parallel_tool_calls is false);
under auto prose passes and a call once opened must follow the schema to its closer."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from engine.answer.tool_request import tool_use
from engine.answer.tool_syntax import SYNTAXES
from engine.grammar import compiled
from engine.grammar.tool_calls import MAX_CALLS, call_grammar

MARKERS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<|python_tag|>"]
MISTRAL_MARKERS = ["[TOOL_CALLS]", "[ARGS]"]  # special in Mistral's own tokenizers
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                     "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "integer", "minimum": -12,
                                              "maximum": 14}}, "required": ["zone"]}}}
NAMED = {"type": "function", "function": {"name": "get_time"}}
ARGS = {"city": "Paris", "unit": "C"}


def call(name="get_weather", args=ARGS, key="arguments", sep=(", ", ": ")) -> str:
    return json.dumps({"name": name, key: args}, separators=sep)


def hermes(*objects: str) -> str:
    return "\n".join(f"<tool_call>\n{o}\n</tool_call>" for o in objects)


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.add_tokens(MARKERS)
    tok.add_tokens(MISTRAL_MARKERS, special_tokens=True)
    return tok


def passes(tok, spec, text: str, pieces: bool = False) -> bool:
    """Whether the grammar takes the whole of `text` and may end there (eos allowed). pieces:
    the markers spelled as text, not as their tokens."""
    matcher = compiled.compile(tok, len(tok), spec).deep_copy()
    if pieces:
        ids = []
        for part in text.replace("<", "\0<").split("\0"):
            ids += tok(part, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    else:
        ids = tok(text, add_special_tokens=False)["input_ids"]
    return matcher.validate_tokens(ids) == len(ids) and matcher.consume_tokens(ids) \
        and matcher.is_accepting()


def grammar(tok, syntax: str, choice="required", parallel=True, thinks=False, opened=False):
    return call_grammar(tool_use([WEATHER, TIME], choice, parallel), SYNTAXES[syntax],
                        lambda t: compiled.special_token(tok, len(tok), t), thinks, opened)


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_required_and_named_let_only_calls_through(tok, choice):
    g = grammar(tok, "hermes", choice)
    time_call = call("get_time", {"zone": 3})
    assert passes(tok, g, hermes(time_call))
    assert passes(tok, g, hermes(time_call, time_call))
    assert passes(tok, g, hermes(call("get_time", {"zone": 3}, sep=(",", ":"))))  # compact
    assert not passes(tok, g, "The time is noon.")
    assert not passes(tok, g, "Sure. " + hermes(time_call))  # the call opens the answer
    assert not passes(tok, g, hermes(call("get_time", {"zone": 99})))  # out of bounds
    assert not passes(tok, g, hermes(call("get_time", {"zone": 3}, key="params")))
    assert not passes(tok, g, hermes(time_call) + " done")  # nothing after the calls
    assert not passes(tok, g, "<tool_call>\n" + time_call)  # the closer is owed
    # the named function alone; required takes any of the tools
    assert passes(tok, g, hermes(call())) == (choice == "required")


def test_one_call_where_parallel_tool_calls_is_false(tok):
    g = grammar(tok, "hermes", parallel=False)
    assert passes(tok, g, hermes(call()))
    assert not passes(tok, g, hermes(call(), call()))


def test_a_marker_spelled_in_pieces_is_the_marker(tok):
    g = grammar(tok, "hermes")
    assert passes(tok, g, hermes(call()), pieces=True)


def test_a_model_that_thinks_thinks_before_its_call(tok):
    think = "<think>Which city?</think>\n\n"
    assert passes(tok, grammar(tok, "hermes", thinks=True), think + hermes(call()))
    assert passes(tok, grammar(tok, "hermes", thinks=True), hermes(call()))
    assert not passes(tok, grammar(tok, "hermes"), think + hermes(call()))
    # the prompt opened the thinking: it closes before the call
    opened = grammar(tok, "hermes", thinks=True, opened=True)
    assert passes(tok, opened, "Which city?</think>\n\n" + hermes(call()))
    assert not passes(tok, opened, hermes(call()))


def test_auto_lets_prose_through_and_holds_an_opened_call(tok):
    g = grammar(tok, "hermes", "auto", thinks=True)
    assert passes(tok, g, "It is sunny.")
    assert passes(tok, g, "<think>no call</think>It is sunny.")
    assert passes(tok, g, "Let me look. " + hermes(call()) + " Done.")
    assert passes(tok, g, "Let me look. " + hermes(call()), pieces=True)
    assert not passes(tok, g, "Let me look. <tool_call>\n" + call("get_rain") + "\n</tool_call>")
    assert not passes(tok, g, "<tool_call>\n" + call(args={"city": "Paris"}) + "\n</tool_call>")
    assert grammar(tok, "hermes", "none") is None


def test_llama3_calls_are_bare_objects_joined_by_semicolons(tok):
    g = grammar(tok, "llama3")
    one, two = call(key="parameters"), call("get_time", {"zone": 1}, key="parameters")
    assert passes(tok, g, one) and passes(tok, g, f"{one}; {two}")
    assert not passes(tok, g, call())  # "arguments" is not Llama's word
    auto = grammar(tok, "llama3", "auto")
    assert passes(tok, auto, "No call.") and passes(tok, auto, f"<|python_tag|>{one}")
    assert not passes(tok, auto, f"<|python_tag|>{call()}")


def test_mistral_calls_in_an_array_or_by_name_and_args(tok):
    g = grammar(tok, "mistral")  # the tokenizer has [ARGS]: the later form
    assert passes(tok, g, '[TOOL_CALLS]get_weather[ARGS]' + json.dumps(ARGS))
    assert passes(tok, g, '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "unit": "F"}'
                          '[TOOL_CALLS]get_time[ARGS]{"zone": 2}')
    assert not passes(tok, g, '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}')
    no_args = lambda t: None if t == "[ARGS]" else compiled.special_token(tok, len(tok), t)
    array = call_grammar(tool_use([WEATHER, TIME], "required", True), SYNTAXES["mistral"],
                         no_args)
    assert passes(tok, array, f"[TOOL_CALLS][{call()}, {call('get_time', {'zone': 0})}]")
    assert not passes(tok, array, f"[TOOL_CALLS]{call()}")


def test_parallel_calls_are_bounded(tok):
    g = grammar(tok, "hermes")
    assert passes(tok, g, hermes(*[call()] * MAX_CALLS))
    assert not passes(tok, g, hermes(*[call()] * (MAX_CALLS + 1)))
