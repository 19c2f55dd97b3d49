"""One tool call written as a JSON object, `{"name": ..., "arguments": ...}` (or "parameters",
Llama 3.1's word), read a character at a time: the call starts as soon as its name is read and
its arguments go out as they arrive, their raw text exactly as the model wrote it, so a stream's
fragments joined equal the whole answer's arguments. An object in another key order is read to
its end and parsed; one that is not a call at all gives its text back (`failed`).
"""

from __future__ import annotations

import json
import re

# the object's text up to the colon after the arguments key, the name read first
_HEAD = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:')
ARGUMENT_KEYS = ("arguments", "parameters")


class JsonDepth:
    """Nesting of a JSON text read so far: depth outside strings, and whether inside one."""

    def __init__(self):
        self.depth, self.in_string, self.escaped = 0, False, False

    def step(self, c: str) -> None:
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif c == "\\":
                self.escaped = True
            elif c == '"':
                self.in_string = False
        elif c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1


class CallObject:
    """Feed it the object's characters, from its `{`. `parts()` hands out what is ready:
    ("start", name), ("arguments", text); `done` once the object closed; `failed` where it
    was not a call (its text is `raw`). `rest` holds what came after the closing brace."""

    def __init__(self, name: str | None = None):
        self.raw = ""
        self.json = JsonDepth()
        self.stage = "head"  # head -> arguments -> tail, or whole (key order unknown)
        self.value = JsonDepth()  # inside the arguments value
        self.value_started = False
        self.done = self.failed = False
        self._ready: list[tuple[str, str]] = []
        # the name given apart (Mistral's `name[ARGS]{...}`): only the arguments value follows,
        # and the object ends with it
        self.bare = name is not None
        if self.bare:
            self.feed(f'{{"name": {json.dumps(name)}, "arguments":')
            self.raw = ""

    def feed(self, text: str) -> str:
        """Read `text`; return what follows the object's end ("" while it is open)."""
        for i, c in enumerate(text):
            self.raw += c
            self.json.step(c)
            if self.stage == "head":
                self._head(c)
            elif self.stage == "arguments":
                self._argument(c)
                if self.bare and self.stage == "tail":
                    self.done = True
                    return text[i + 1:]
            if self.json.depth == 0:
                self._close()
                return text[i + 1:]
        return ""

    def _head(self, c: str) -> None:
        if c == ":" and not self.json.in_string and self.json.depth == 1:
            m = _HEAD.fullmatch(self.raw)
            if m:
                self._ready.append(("start", json.loads(m.group(1))))
                self.stage = "arguments"
            elif re.search(r'"(?:arguments|parameters)"\s*:$', self.raw):
                self.stage = "whole"  # the arguments before the name: read it all, then parse

    def _argument(self, c: str) -> None:
        if not self.value_started:
            if c.isspace():
                return
            self.value_started = True
        outer_closed = self.json.depth == 0 and not self.json.in_string
        if outer_closed or (c == "," and self.value.depth == 0 and not self.value.in_string):
            self.stage = "tail"  # a scalar value ended at the brace or comma after it
            return
        self.value.step(c)
        self._ready.append(("arguments", c))
        if self.value.depth == 0 and not self.value.in_string and c in '}]"':
            self.stage = "tail"  # an object, array or string value closed

    def _close(self) -> None:
        self.done = True
        if self.stage in ("tail", "arguments"):  # arguments: a scalar the outer brace ended
            return
        try:
            obj = json.loads(self.raw)
        except ValueError:
            obj = None
        key = next((k for k in ARGUMENT_KEYS if isinstance(obj, dict) and k in obj), None)
        if key is None or not isinstance(obj.get("name"), str):
            self.failed = True
            return
        args = obj[key]
        self._ready.append(("start", obj["name"]))
        self._ready.append(("arguments", args if isinstance(args, str)
                            else json.dumps(args, ensure_ascii=False)))

    @property
    def started(self) -> bool:
        return self.stage in ("arguments", "tail")

    def parts(self) -> list[tuple[str, str]]:
        """What is ready, argument characters joined into one fragment."""
        out: list[tuple[str, str]] = []
        for kind, text in self._ready:
            if out and kind == "arguments" and out[-1][0] == "arguments":
                out[-1] = ("arguments", out[-1][1] + text)
            else:
                out.append((kind, text))
        self._ready = []
        return out
