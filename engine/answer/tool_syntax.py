"""The tool-call syntax of each model family, chosen from the chat template at load, and a reader
that pulls the calls out of an answer's content as it streams:

  hermes   `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number (Qwen2.5,
           Qwen3, Hermes and the many templates that copied them)
  llama3   a bare `{"name": ..., "parameters": {...}}` at the answer's start, after an optional
           `<|python_tag|>`, several joined by `;` (Llama 3.1 to 3.3)
  mistral  `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral's v3 templates), or
           `[TOOL_CALLS]name[ARGS]{...}` once a call (the later ones)
  generic  the fallback for a template with no known syntax: the hermes tags, or a bare call
           object at the answer's start

Text outside calls is content; a marker arriving in pieces is held back until it is known to be
one or not, and whatever turns out not to be a call goes out as content after all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.answer.call_object import CallObject
from engine.answer.parts import CallArguments, CallStart, Content, call_id


@dataclass(frozen=True)
class ToolSyntax:
    name: str
    openers: tuple[str, ...]  # markers that open calls
    closer: str = ""  # what ends each call (hermes); "" where nothing does
    bare_at_start: bool = False  # a call object may open the answer with no marker
    separator: str = ""  # between calls written one after another (";" for llama3)
    in_array: bool = False  # after the opener, a JSON array of call objects (mistral)
    id_length: int = 24

    def reader(self) -> CallReader:
        return CallReader(self)


HERMES = ToolSyntax("hermes", ("<tool_call>",), closer="</tool_call>")
LLAMA3 = ToolSyntax("llama3", ("<|python_tag|>",), bare_at_start=True, separator=";")
MISTRAL = ToolSyntax("mistral", ("[TOOL_CALLS]",), in_array=True, id_length=9)
GENERIC = ToolSyntax("generic", ("<tool_call>",), closer="</tool_call>", bare_at_start=True)
SYNTAXES = {s.name: s for s in (HERMES, LLAMA3, MISTRAL, GENERIC)}
ARGS = "[ARGS]"  # after a function's name, in Mistral's later form
_NAME_BEFORE_ARGS = re.compile(r"\s*([A-Za-z0-9_-]{1,64})\[ARGS\]")


def syntax_for(template: str | None) -> ToolSyntax:
    """The family's syntax, read from what its chat template writes for an assistant's calls."""
    template = template or ""
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<|python_tag|>" in template or ('"parameters"' in template and "ipython" in template):
        return LLAMA3
    if "<tool_call>" in template:
        return HERMES
    return GENERIC


def _held_back(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that begins some marker (and could finish it)."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


class CallReader:
    """Content text in, parts out (Content, CallStart, CallArguments) in order. Whitespace
    before the answer's first word, and right after each call, is held until text follows it
    (none follows a call's template newlines): a stream and the whole answer read alike."""

    def __init__(self, syntax: ToolSyntax):
        self.syntax = syntax
        self.stage = "start"  # start -> content | open -> object -> after -> content | open
        self.pending = ""  # text read but not yet handed out
        self.marker = ""  # the opener of the call being read, given back if it is none
        self.in_array = False  # inside mistral's [...] of calls
        self.trim = False  # content right after a call: its leading whitespace is dropped
        self.call: CallObject | None = None
        self.num_calls = 0
        self.out: list = []

    def feed(self, text: str) -> list:
        self.pending += text
        while self._advance():
            pass
        out, self.out = self.out, []
        return out

    def _content(self, text: str) -> None:
        if text:
            self.out.append(Content(text))

    def _advance(self) -> bool:
        """One step over `pending`; False when it needs more text."""
        if self.stage == "start":
            stripped = self.pending.lstrip()
            if not stripped:
                return False
            if self.syntax.bare_at_start and stripped[0] == "{":
                self.pending, self.marker = stripped, ""
                self.stage, self.call = "object", CallObject()
            else:
                self.stage = "content"
            return True
        if self.stage == "content":
            return self._in_content()
        if self.stage == "open":
            return self._opened()
        if self.stage == "object":
            return self._in_object()
        return self._after()

    def _in_content(self) -> bool:
        if self.trim:
            self.pending = self.pending.lstrip()
            if not self.pending:
                return False
            self.trim = False
        openers = self.syntax.openers
        found = [(self.pending.find(m), m) for m in openers if m in self.pending]
        if found:  # the template's newline before a call is no content either
            at, m = min(found)
            before = self.pending[:at].rstrip()
            self._content(before)
            # the space before goes with the marker: back into the content if no call follows
            self.marker = self.pending[len(before):at] + m
            self.pending, self.stage = self.pending[at + len(m):], "open"
            return True
        keep = _held_back(self.pending, openers)
        ready = self.pending[:len(self.pending) - keep]
        ready = ready.rstrip()  # trailing whitespace waits: a call may follow it
        self._content(ready)
        self.pending = self.pending[len(ready):]
        return False

    def _opened(self) -> bool:
        stripped = self.pending.lstrip()
        if not stripped:
            return False
        if self.syntax.in_array and not self.in_array and stripped[0] == "[":
            self.marker += self.pending[:len(self.pending) - len(stripped) + 1]
            self.pending, self.in_array = stripped[1:], True
            return True
        if stripped[0] == "{":
            self.pending, self.stage, self.call = stripped, "object", CallObject()
            return True
        if self.syntax.in_array and not self.in_array:  # perhaps name[ARGS]
            m = _NAME_BEFORE_ARGS.match(self.pending)
            if m:
                self.marker += self.pending[:m.end()]
                self.pending = self.pending[m.end():]
                self.stage, self.call = "object", CallObject(m.group(1))
                return True
            head = stripped[:65 + len(ARGS)]
            name = re.match(r"[A-Za-z0-9_-]*", head).group()
            if len(name) <= 64 and ARGS.startswith(head[len(name):]):
                return False  # the name, or [ARGS], still arriving
        self._give_back(self.marker + self.pending)  # not a call after all
        return True

    def _in_object(self) -> bool:
        text, self.pending = self.pending, ""
        rest = self.call.feed(text)
        for kind, part in self.call.parts():
            if kind == "start":
                self.out.append(CallStart(self.num_calls, call_id(self.syntax.id_length), part))
                self.num_calls += 1
            else:
                self.out.append(CallArguments(self.num_calls - 1, part))
        if not self.call.done:
            return False
        if self.call.failed:
            self._give_back(self.marker + self.call.raw + rest)
        else:
            self.pending, self.stage = rest, "after"
        return True

    def _after(self) -> bool:
        s = self.syntax
        stripped = self.pending.lstrip()
        if not stripped:
            return False
        if s.closer:
            if s.closer.startswith(stripped) and stripped != s.closer:
                return False  # the closer, in pieces
            if stripped.startswith(s.closer):
                stripped = stripped[len(s.closer):]
        elif self.in_array:
            if stripped[0] == ",":
                self.pending, self.stage = stripped[1:], "open"
                return True
            if stripped[0] == "]":
                stripped, self.in_array = stripped[1:], False
        elif s.separator and stripped.startswith(s.separator):
            self.pending, self.stage = stripped[len(s.separator):], "open"
            self.marker = s.separator
            return True
        self.pending, self.stage, self.trim = stripped, "content", True
        return True

    def _give_back(self, text: str) -> None:
        """Text that looked like a call's start and was not: content (no call starts inside
        it), and reading goes on after it."""
        self.stage, self.marker, self.call, self.in_array = "content", "", None, False
        self.pending = ""
        self._content(text)

    def finish(self) -> list:
        """The answer ended: what is still held goes out. A call cut short stays a call (its
        arguments as far as they came, as OpenAI's own do at a length finish)."""
        if self.stage in ("start", "content") and not self.trim:
            self._content(self.pending)
        elif self.stage == "open" and not self.in_array and self.marker != self.syntax.separator:
            self._content(self.marker + self.pending)
        elif self.stage == "object" and not self.call.started:
            self._content(self.marker + self.call.raw)
        self.pending = ""
        out, self.out = self.out, []
        return out
