"""A request's tools, tool_choice and chat_template_kwargs checked, and the schema a call must
follow (the hook a grammar enforces required and named choices by)."""

from __future__ import annotations

import pytest

from engine.answer.tool_request import (
    RequestError,
    assistant_calls,
    fit_call_ids,
    template_kwargs,
    tool_use,
    with_instruction,
)

F = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}}}}
G = {"type": "function", "function": {"name": "g"}}


def test_auto_and_none_and_no_tools():
    assert tool_use(None, None, None) is None and tool_use([], "none", None) is None
    auto = tool_use([F, G], None, None)
    assert auto.choice == "auto" and auto.template_tools() == [F, G] and auto.parallel
    assert auto.instruction() is None and not auto.must_call
    assert len(auto.call_schema()["anyOf"]) == 2  # the grammar's, once an opener appears
    none = tool_use([F], "none", False)
    assert none.template_tools() is None and none.call_schema() is None


def test_named_renders_that_function_alone_and_gives_its_call_schema():
    named = tool_use([F, G], {"type": "function", "function": {"name": "f"}}, False)
    assert named.template_tools() == [F] and not named.parallel and named.must_call
    schema = named.call_schema()
    assert schema["properties"]["name"] == {"const": "f"}
    assert schema["properties"]["arguments"] == F["function"]["parameters"]
    assert "the function f" in named.instruction()


def test_required_schema_allows_each_function():
    schema = tool_use([F, G], "required", None).call_schema()
    assert [o["properties"]["name"]["const"] for o in schema["anyOf"]] == ["f", "g"]
    assert schema["anyOf"][1]["properties"]["arguments"] == {"type": "object"}


@pytest.mark.parametrize("tools, choice, param", [
    ([F], {"type": "function", "function": {"name": "h"}}, "tool_choice"),
    ([F], "sometimes", "tool_choice"),
    (None, "required", "tool_choice"),
    ([F, F], None, "tools"),
    ([{"type": "function", "function": {"name": "bad name"}}], None, "tools[0].function.name"),
    ([{"type": "code_interpreter"}], None, "tools[0]"),
])
def test_bad_tools_name_their_parameter(tools, choice, param):
    with pytest.raises(RequestError) as e:
        tool_use(tools, choice, None)
    assert e.value.param == param


def test_template_kwargs_are_few_named_scalars_and_never_the_renderers_own():
    assert template_kwargs({"enable_thinking": False}) == {"enable_thinking": False}
    for bad in ({"enable_thinking": [1]}, {"tools": 1}, {"not a name": 1},
                {f"k{i}": 1 for i in range(17)}, {"x": "y" * 1001}):
        with pytest.raises(RequestError):
            template_kwargs(bad)


def test_history_arguments_are_objects_for_the_template():
    calls = assistant_calls([{"id": "c1", "type": "function",
                              "function": {"name": "f", "arguments": '{"a": 1}'}}], 1)
    assert calls[0]["function"]["arguments"] == {"a": 1}


def test_the_instruction_joins_the_system_message_or_makes_one():
    msgs = [{"role": "user", "content": "hi"}]
    assert with_instruction(msgs, "Call.")[0] == {"role": "system", "content": "Call."}
    sys_first = [{"role": "system", "content": "Be brief."}, *msgs]
    assert with_instruction(sys_first, "Call.")[0]["content"] == "Be brief.\n\nCall."


def test_mistral_history_ids_become_nine_letters_and_digits_alike_in_call_and_result():
    history = [{"role": "assistant", "content": None, "tool_calls": assistant_calls(
        [{"id": "call_abc", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        0)}, {"role": "tool", "tool_call_id": "call_abc", "content": "1"}]
    fitted = fit_call_ids(history, 9)
    new_id = fitted[0]["tool_calls"][0]["id"]
    assert len(new_id) == 9 and new_id.isalnum() and fitted[1]["tool_call_id"] == new_id
    assert fit_call_ids(history, 24) == history  # other families keep the client's ids
