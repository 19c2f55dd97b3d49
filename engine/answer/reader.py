"""An answer's text, piece by piece as the engine gives it, read into message parts: the thinking
first (engine/answer/reasoning.py), then calls in the family's syntax out of the content
(engine/answer/tool_syntax.py). A whole answer is read by the same code, fed at once: a stream's
deltas joined equal the non-streamed message, by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.answer.parts import CallArguments, CallStart, Content, Message
from engine.answer.reasoning import ReasoningReader
from engine.answer.tool_syntax import ToolSyntax


@dataclass(frozen=True)
class Reading:
    """How one request's answers are read: `syntax` None where calls are not parsed (no tools,
    or tool_choice "none"); `thinks` where the thinking is split off, `thinking_open` where the
    prompt opened it; `max_calls` 1 under parallel_tool_calls false (later calls dropped).
    `must_call` (tool_choice required: "", a named function: its name) holds content back to
    the end, and an answer without such a call is `missing_call`."""

    syntax: ToolSyntax | None = None
    thinks: bool = False
    thinking_open: bool = False
    max_calls: int | None = None
    must_call: str | None = None

    @property
    def is_plain(self) -> bool:
        """Nothing to read: the text is the content as it comes."""
        return self.syntax is None and not self.thinks

    def reader(self) -> AnswerReader:
        return AnswerReader(self)


class AnswerReader:
    def __init__(self, reading: Reading):
        self.reading = reading
        self.thinking = ReasoningReader(reading.thinking_open) if reading.thinks else None
        self.calls = reading.syntax.reader() if reading.syntax else None
        self.called: list[str] = []  # the functions called, in order
        self.held = ""  # content held back to the end (under must_call)

    def feed(self, text: str) -> list:
        if self.thinking is not None:
            return self._hold(self._through_calls(self.thinking.feed(text)))
        return self._hold(self._through_calls([Content(text)] if text else []))

    def finish(self) -> list:
        out = self._through_calls(self.thinking.finish() if self.thinking else [])
        if self.calls is not None:
            out += [p for p in self.calls.finish() if self._kept(p)]
        out = self._hold(out)
        if self.held:
            out.append(Content(self.held))
            self.held = ""
        return out

    def _hold(self, parts: list) -> list:
        if self.reading.must_call is None:
            return parts
        self.held += "".join(p.text for p in parts if isinstance(p, Content))
        return [p for p in parts if not isinstance(p, Content)]

    def missing_call(self) -> str | None:
        """Why the answer falls short of tool_choice (after finish), or None where it does not:
        no call under "required", none of the named function under a named choice."""
        wanted = self.reading.must_call
        if wanted is None or (self.called and (not wanted or wanted in self.called)):
            return None
        which = f"the function {wanted}" if wanted else "a function"
        return (f"the model answered without calling {which}, which tool_choice requires; "
                "this server asks it of the model but does not yet enforce it")

    def _through_calls(self, parts: list) -> list:
        if self.calls is None:
            return parts
        out = []
        for part in parts:
            out.extend(self.calls.feed(part.text) if isinstance(part, Content) else [part])
        return [p for p in out if self._kept(p)]

    def _kept(self, part) -> bool:
        limit = self.reading.max_calls
        if limit is not None and isinstance(part, (CallStart, CallArguments)) \
                and part.index >= limit:
            return False
        if isinstance(part, CallStart):
            self.called.append(part.name)
        return True


def read_whole(reading: Reading, text: str) -> tuple[Message, str | None]:
    """The whole answer's message, and why it falls short of tool_choice (None where not)."""
    reader = reading.reader()
    message = Message()
    for part in reader.feed(text) + reader.finish():
        message.add(part)
    return message, reader.missing_call()
