"""Do Anthropic's and OpenAI's newer SDK paths work unchanged against `hearth serve`? Starts
`hearth serve` on each model (the models and server of bench/client_check.py) and runs the
official `anthropic` SDK's messages.create and messages.stream and a tool-use round trip, and the
`openai` SDK's responses.create, responses.stream and a function-call round trip; a greedy answer
through each route must equal the chat-completions answer to the same conversation, and a
streamed one the whole one. Prints one PASS or FAIL line a check.

    /tmp/clients/bin/pip install openai anthropic jsonschema
    /tmp/clients/bin/python bench/protocol_check.py [--hearth-python .venv/bin/python]
        [--tree DIR] [--model FOLDER ...] [--work DIR] [--only TEXT] [--json]
"""

from __future__ import annotations

import json
import sys

import jsonschema
from client_check import WEATHER_PROMPT, WEATHER_TOOL, Server, openai_client, run

CLIENTS = ("openai", "anthropic")
MAX_TOKENS = 48
QUESTION = "Say something about the sea."
PARAMETERS = WEATHER_TOOL["function"]["parameters"]
GREEDY = {"temperature": 0}  # the anthropic SDK 2 takes no temperature argument of its own


def claude(srv: Server):
    import anthropic

    return anthropic.Anthropic(base_url=srv.url.removesuffix("/v1"), api_key="unused",
                               max_retries=0, timeout=600)


def chat_answer(srv: Server, messages: list[dict]) -> str:
    done = openai_client(srv).chat.completions.create(
        model=srv.model, messages=messages, max_tokens=MAX_TOKENS, temperature=0)
    return done.choices[0].message.content


def check_messages(srv: Server) -> str:
    ask = dict(model=srv.model, max_tokens=MAX_TOKENS, extra_body=GREEDY,
               messages=[{"role": "user", "content": QUESTION}])
    whole = claude(srv).messages.create(**ask)
    text = "".join(b.text for b in whole.content if b.type == "text")
    assert text == chat_answer(srv, ask["messages"]), "not the chat route's answer"
    with claude(srv).messages.stream(**ask) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text, f"streamed {streamed!r} is not the whole {text!r}"
    assert final.stop_reason == whole.stop_reason and final.usage == whole.usage
    return f"{whole.stop_reason}, {whole.usage.output_tokens} tokens: {text[:60]!r}"


def check_messages_tool_use(srv: Server) -> str:
    tools = [{"name": "get_weather", "description": WEATHER_TOOL["function"]["description"],
              "input_schema": PARAMETERS}]
    turns = [{"role": "user", "content": WEATHER_PROMPT}]
    first = claude(srv).messages.create(
        model=srv.model, max_tokens=MAX_TOKENS, extra_body=GREEDY, messages=turns, tools=tools,
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
    uses = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and uses, f"{first.stop_reason}: {first.content}"
    for use in uses:
        jsonschema.validate(use.input, PARAMETERS)
    turns += [{"role": "assistant", "content": first.content},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id,
                                            "content": "18 C, clear"} for u in uses]}]
    second = claude(srv).messages.create(model=srv.model, max_tokens=MAX_TOKENS,
                                         extra_body=GREEDY, messages=turns, tools=tools)
    assert second.content, "no answer after the tool's result"
    return f"{len(uses)} call(s) {uses[0].input}, then {second.stop_reason}"


def check_responses(srv: Server) -> str:
    ask = dict(model=srv.model, input=QUESTION, max_output_tokens=MAX_TOKENS, temperature=0)
    whole = openai_client(srv).responses.create(**ask)
    assert whole.output_text == chat_answer(srv, [{"role": "user", "content": QUESTION}]), \
        "not the chat route's answer"
    # an answer cut at max_output_tokens ends in response.incomplete, as OpenAI's does, which
    # the SDK's get_final_response() does not take: the last event's response instead
    with openai_client(srv).responses.stream(**ask) as stream:
        events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    final = events[-1].response
    assert events[-1].type == f"response.{whole.status}", events[-1].type
    assert "".join(deltas) == final.output_text == whole.output_text, "streamed is not whole"
    return f"{whole.status}, {whole.usage.output_tokens} tokens: {whole.output_text[:60]!r}"


def check_responses_function_call(srv: Server) -> str:
    tools = [{"type": "function", "name": "get_weather", "strict": True,
              "description": WEATHER_TOOL["function"]["description"], "parameters": PARAMETERS}]
    client = openai_client(srv)
    first = client.responses.create(model=srv.model, input=WEATHER_PROMPT, tools=tools,
                                    tool_choice="required", max_output_tokens=MAX_TOKENS,
                                    temperature=0)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls, f"no function_call in {[item.type for item in first.output]}"
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), PARAMETERS)
    results = [{"type": "function_call_output", "call_id": c.call_id, "output": "18 C, clear"}
               for c in calls]
    second = client.responses.create(model=srv.model, previous_response_id=first.id,
                                     input=results, tools=tools, max_output_tokens=MAX_TOKENS,
                                     temperature=0)
    assert second.output, "no answer after the function's output"
    return f"{len(calls)} call(s) {calls[0].arguments}, then {second.status}"


CHECKS = {
    "anthropic messages.create = chat answer, messages.stream = whole": check_messages,
    "anthropic tool_use round trip (tool_choice tool, then tool_result)": check_messages_tool_use,
    "openai responses.create = chat answer, responses.stream = whole": check_responses,
    "openai responses function_call round trip (previous_response_id)":
        check_responses_function_call,
}


if __name__ == "__main__":
    sys.exit(run(CHECKS, CLIENTS, __doc__.split("\n\n")[0]))
