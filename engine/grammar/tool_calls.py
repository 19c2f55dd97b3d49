"""The grammar that holds a chat answer to tool_choice, written in llguidance's Lark form from the
family's call syntax (engine/answer/tool_syntax.py) and the call schema of the request's tools
(ToolUse.call_schema):

  required, a named function  the answer opens with a call (after the thinking, for a model
                              that thinks) and holds nothing but calls: the family's opener, an
                              object of the call schema, the closer; several where
                              parallel_tool_calls allows (MAX_CALLS at most), one where
                              not; then it ends.
  auto                        any text, until the opener appears: from there a lazy rule holds
                              the call to the schema and the closer, then text again (the
                              grammar is lazy: it is one matcher from the first token, and
                              costs a text mask until the trigger).

A marker that is one special token of the tokenizer (Qwen's `<tool_call>`, Llama's
`<|python_tag|>`, Mistral's `[TOOL_CALLS]`) is named by its id, or its text spelled in pieces:
llguidance never reads a special token as text. Between a call object's tokens one space at
most may stand (compact JSON, and the templates' `tojson` layout, ", " and ": ", both pass), so
an answer cannot pad itself with blanks to its token limit.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from engine.answer.reasoning import CLOSE, OPEN
from engine.answer.tool_request import ToolUse
from engine.answer.tool_syntax import ARGS, ToolSyntax
from engine.events import GrammarSpec
from engine.grammar.compiled import closed_objects

# one optional space between a call object's tokens
JSON_LAYOUT = {"whitespace_flexible": True, "whitespace_pattern": "[ ]?"}
TEXT = "TEXT: /(.|\\n)*/"
BLANK = "BLANK: /[ \\n]{0,2}/"  # between the thinking and a call, and between calls
# calls in one answer at most: a small model that never chooses to stop still ends
MAX_CALLS = 8
MORE = f"{{0,{MAX_CALLS - 1}}}"


def _call_json(schema: dict) -> str:
    """A call object's JSON rule; objects that list their properties take no others, as under
    response_format (a client's tool schema seldom says additionalProperties)."""
    return "%json " + json.dumps({**closed_objects(schema), "x-guidance": JSON_LAYOUT})


class _Writer:
    """Lark text for one syntax; `special(text)` is the id of a marker that is one special
    token of the tokenizer, else None."""

    def __init__(self, syntax: ToolSyntax, special: Callable[[str], int | None]):
        self.syntax, self.special = syntax, special

    def marker(self, text: str) -> str:
        """The marker: its special token or its text (a model may spell it in pieces)."""
        token = self.special(text)
        return f"(<[{token}]> | {json.dumps(text)})" if token is not None else json.dumps(text)

    def after_text(self, rule: str, text: str) -> list[str]:
        """`rule`: any text, then the marker `text` (lazy: the first one ends it)."""
        token = self.special(text)
        lazy = [f"{rule}_text[lazy]: TEXT {json.dumps(text)}"]
        if token is None:
            return [f"{rule}: {rule}_text", *lazy]
        return [f"{rule}: {rule}_token | {rule}_text", f"{rule}_token: TEXT <[{token}]>", *lazy]

    def calls(self, tools: ToolUse) -> list[str]:
        """`calls`: the calls after the opener, one where parallel_tool_calls is false."""
        s = self.syntax
        # another call after the first: its own opener again (hermes, Mistral's later form)
        again = f" (BLANK {self.marker(s.openers[0])} call){MORE}" if tools.parallel else ""
        if s.name == "mistral" and self.special(ARGS) is not None:  # name[ARGS]{...}, each
            names = [t["function"]["name"] for t in tools.template_tools() or []]
            params = [t["function"].get("parameters") or {"type": "object"}
                      for t in tools.template_tools() or []]
            alts = " | ".join(f"named_{i}" for i in range(len(names)))
            rules = [f"call: {alts}"] + [
                f"named_{i}: {json.dumps(n)} {self.marker(ARGS)} {_call_json(p)}"
                for i, (n, p) in enumerate(zip(names, params, strict=True))]
            return [f"calls: call{again}", *rules]
        key = "parameters" if s.name == "llama3" else "arguments"
        rules = [f"object: {_call_json(tools.call_schema(key))}"]
        if s.in_array:
            more = f' (", " object){MORE}' if tools.parallel else ""
            return [f'calls: " "? "[" object{more} "]"', *rules]
        if s.closer:
            closer = self.marker(s.closer)
            rules.append(f'call: "\\n"? object "\\n"? {closer}')
            return [f"calls: call{again}", *rules]
        more = f' ({json.dumps(s.separator)} " "? object){MORE}' if tools.parallel else ""
        return [f"calls: object{more}", *rules]

    def thinking(self, thinking_open: bool) -> list[str]:
        """`thinking`: the thinking to its close (opened by the prompt, or by the answer)."""
        rules = self.after_text("thought", CLOSE)
        if thinking_open:
            return ["thinking: thought", *rules]
        return [f"thinking: {self.marker(OPEN)} thought", *rules]


def call_grammar(tools: ToolUse, syntax: ToolSyntax, special: Callable[[str], int | None],
                 thinks: bool = False, thinking_open: bool = False) -> GrammarSpec | None:
    """The grammar of an answer under `tools` (None under tool_choice "none"). thinks: the
    model may think first (a thinking the prompt opened must close before a call)."""
    if tools.choice == "none" or not tools.template_tools():
        return None
    w = _Writer(syntax, special)
    opener = w.marker(syntax.openers[0])
    rules = ["%llguidance {}"]
    # the thinking apart: a special token (`<think>` is one, to llguidance, wherever it is an
    # added token) is no text, so a grammar that did not name it would forbid it
    first = ("thinking BLANK " if thinking_open else "(thinking BLANK)? ") if thinks else ""
    if tools.must_call and syntax.bare_at_start and not syntax.closer:  # llama3: calls alone
        rules.append(f"start: {first}calls BLANK")
    elif tools.must_call:
        rules.append(f"start: {first}{opener} calls BLANK")
    else:
        rules.append(f"start: {first}tag{'*' if tools.parallel else '?'} TEXT")
        rules += [*w.after_text("opened", syntax.openers[0]), "tag: opened calls"]
    rules += w.thinking(thinking_open) if thinks else []
    rules += [*w.calls(tools), TEXT, BLANK]
    return GrammarSpec("lark", "\n".join(rules) + "\n")
