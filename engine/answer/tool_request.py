"""A chat request's tools, checked and made ready for the chat template: the `tools` list,
`tool_choice` and `parallel_tool_calls`; assistant `tool_calls` and tool results in the history;
and `chat_template_kwargs` (bounded, JSON scalars only). Every refusal is a RequestError naming
its parameter.

`required` and a named function are asked of the model by an instruction in the system message
and enforced by a grammar (engine/grammar/tool_calls.py), which takes its schema from
`ToolUse.call_schema()`; an answer cut short before its call is an outcome of its own
(AnswerReader.missing_call).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from engine.answer.parts import ID_CHARS
from engine.answer.tool_syntax import GENERIC
from engine.events import BadRequest

MAX_TOOLS = 128  # OpenAI's own bound
MAX_TOOL_CALLS = 128  # in one assistant message of the history
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TEMPLATE_KWARGS = 16
MAX_KWARG_NAME_CHARS = 64
MAX_KWARG_TEXT_CHARS = 1000
# what the renderer sets itself: a template kwarg must not replace it
RESERVED_KWARGS = frozenset({
    "messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
    "chat_template", "return_assistant_tokens_mask", "conversations", "bos_token", "eos_token",
    "unk_token", "pad_token", "sep_token", "cls_token", "mask_token",
    "additional_special_tokens", "raise_exception", "strftime_now"})


class RequestError(BadRequest):
    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolUse:
    tools: tuple[dict, ...]  # {"type": "function", "function": {"name", ...}}, as sent
    choice: str  # "auto", "none", "required" or "function"
    function: str | None = None  # the one named, under "function"
    parallel: bool = True

    def names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools)

    def template_tools(self) -> list[dict] | None:
        """What the template renders: none under "none" (the model is not to call), only the
        named function under a named choice (it can call nothing else)."""
        if self.choice == "none" or not self.tools:
            return None
        if self.function is not None:
            return [t for t in self.tools if t["function"]["name"] == self.function]
        return list(self.tools)

    @property
    def must_call(self) -> bool:
        return self.choice in ("required", "function")

    def instruction(self) -> str | None:
        """The system message's addition under required or a named function."""
        if self.function is not None:
            return (f"You must answer by calling the function {self.function}; do not answer "
                    "in prose.")
        if self.choice == "required":
            return ("You must answer by calling one or more of the functions provided; do not "
                    "answer in prose.")
        return None

    def call_schema(self, arguments: str = "arguments") -> dict | None:
        """The JSON schema each call object must follow (None under "none"): the grammar's
        hook (engine/grammar/tool_calls.py). The model writes each call in its family's markers
        (ToolSyntax.openers and closer) around an object of this schema; one call at most where
        `parallel` is false. Under required or a named function a call must open the answer
        (`must_call`); under auto the schema holds once an opener appears. `arguments`: the
        family's key for them (Llama 3.1's is "parameters")."""
        if self.choice == "none":
            return None
        tools = self.template_tools() or []
        options = [{"type": "object", "additionalProperties": False,
                    "required": ["name", arguments],
                    "properties": {"name": {"const": t["function"]["name"]},
                                   arguments: t["function"].get("parameters")
                                   or {"type": "object"}}} for t in tools]
        return options[0] if len(options) == 1 else {"anyOf": options}


def _function(tool, i: int) -> dict:
    param = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise RequestError(f"{param}.type must be \"function\" (the only kind of tool a chat "
                           "model calls)", param)
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise RequestError(f"{param}.function must be an object with a name", param)
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RequestError(f"{param}.function.name must be 1 to 64 letters, digits, "
                           "underscores or dashes", f"{param}.function.name")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise RequestError(f"{param}.function.parameters must be a JSON schema object",
                           f"{param}.function.parameters")
    if not isinstance(fn.get("description", ""), str):
        raise RequestError(f"{param}.function.description must be text",
                           f"{param}.function.description")
    return {"type": "function", "function": fn}


def tool_use(tools: list | None, tool_choice, parallel: bool | None) -> ToolUse | None:
    """The request's tools, or None where it has none and asks for no call."""
    if tools is not None and len(tools) > MAX_TOOLS:
        raise RequestError(f"tools takes at most {MAX_TOOLS} functions, got {len(tools)}",
                           "tools")
    checked = tuple(_function(t, i) for i, t in enumerate(tools or ()))
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        raise RequestError("tools has two functions of one name", "tools")
    choice, function = tool_choice if tool_choice is not None else "auto", None
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        function = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(function, str):
            raise RequestError('tool_choice must be "none", "auto", "required" or {"type": '
                               '"function", "function": {"name": ...}}', "tool_choice")
        if function not in names:
            raise RequestError(f"tool_choice names the function {function[:64]!r}, which is not "
                               "in tools", "tool_choice")
        choice = "function"
    elif choice not in ("none", "auto", "required"):
        raise RequestError('tool_choice must be "none", "auto", "required" or a function',
                           "tool_choice")
    if choice == "required" and not checked:
        raise RequestError('tool_choice "required" needs tools to call', "tool_choice")
    if not checked:
        return None
    return ToolUse(checked, choice, function, parallel is not False)


def assistant_calls(calls: list, i: int) -> list[dict]:
    """An assistant message's tool_calls as templates read them: the arguments (a JSON text on
    the wire) as an object, which Qwen's, Llama's and Mistral's templates render with tojson."""
    param = f"messages[{i}].tool_calls"
    if len(calls) > MAX_TOOL_CALLS:
        raise RequestError(f"{param} holds more than {MAX_TOOL_CALLS} calls", param)
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"{param}[{j}] must have a function with a name", param)
        arguments = fn.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                raise RequestError(f"{param}[{j}].function.arguments is not valid JSON",
                                   param) from None
        out.append({"id": str(call.get("id") or f"call_{j}"), "type": "function",
                    "function": {"name": fn["name"], "arguments": arguments}})
    return out


def calls_as_text(messages: list[dict]) -> list[dict]:
    """For a template that renders no tool_calls (it reads only `content`): each assistant
    message's calls written into its content as the generic syntax writes them, after its text
    (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), which is what the model itself
    writes under tools with such a template; tool results stay messages of their role."""
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            written = "".join(
                GENERIC.openers[0] + json.dumps({"name": c["function"]["name"],
                                                 "arguments": c["function"]["arguments"]})
                + GENERIC.closer for c in m["tool_calls"])
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = (m.get("content") or "") + written
        out.append(m)
    return out


def template_kwargs(given: dict | None) -> dict:
    """chat_template_kwargs as the template receives them: a few named JSON scalars."""
    if not given:
        return {}
    if len(given) > MAX_TEMPLATE_KWARGS:
        raise RequestError(f"chat_template_kwargs takes at most {MAX_TEMPLATE_KWARGS} "
                           "settings", "chat_template_kwargs")
    for key, value in given.items():
        if not key.isidentifier() or len(key) > MAX_KWARG_NAME_CHARS:
            raise RequestError(f"chat_template_kwargs key {key[:64]!r} is not a name",
                               "chat_template_kwargs")
        if key in RESERVED_KWARGS:
            raise RequestError(f"chat_template_kwargs may not set {key!r}: the server sets it",
                               "chat_template_kwargs")
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise RequestError(f"chat_template_kwargs.{key} must be a string, number, boolean "
                               "or null", "chat_template_kwargs")
        if isinstance(value, str) and len(value) > MAX_KWARG_TEXT_CHARS:
            raise RequestError(f"chat_template_kwargs.{key} is longer than "
                               f"{MAX_KWARG_TEXT_CHARS} characters", "chat_template_kwargs")
    return dict(given)


def with_instruction(messages: list[dict], instruction: str | None) -> list[dict]:
    """`messages` with `instruction` added to the system message (one made where none is)."""
    if instruction is None:
        return messages
    if messages and messages[0]["role"] == "system" and isinstance(messages[0]["content"], str):
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{instruction}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": instruction}, *messages]


def fit_call_ids(messages: list[dict], length: int) -> list[dict]:
    """Call ids in the history in the family's shape: Mistral's templates refuse any but nine
    letters and digits, and a client sends back OpenAI's `call_...`. An id of another shape is
    replaced by one derived from it, alike in the call and in the result that answers it."""
    if length != 9:
        return messages

    def fit(i: str) -> str:
        if len(i) == length and i.isalnum():
            return i
        digest = hashlib.sha256(i.encode()).digest()
        return "".join(ID_CHARS[b % len(ID_CHARS)] for b in digest[:length])

    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{**c, "id": fit(c["id"])} for c in m["tool_calls"]]}
        if m.get("tool_call_id") is not None:
            m = {**m, "tool_call_id": fit(m["tool_call_id"])}
        out.append(m)
    return out
