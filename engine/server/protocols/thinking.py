"""A thinking model's answer split into its thinking and its text: an answer that opens with
`<think>` thinks until `</think>` (the tags Hearth's engine and the chat route carry reasoning
in), for the protocols that give thinking a block of its own. Fed piece by piece as it streams:
text that may still be the start of a tag is held back until the next piece decides it.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def _held(text: str, tag: str) -> int:
    """How many characters at the end of `text` could begin `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ThinkingSplit:
    def __init__(self):
        self.state = "start"  # start (undecided), thinking, after (its newlines), text
        self.pending = ""
        self.thought = False  # the answer opened with the tag

    def feed(self, piece: str) -> list[tuple[str, str]]:
        """-> (kind, text) pieces, kind "thinking" or "text", in order; empty ones left out."""
        self.pending += piece
        out: list[tuple[str, str]] = []
        if self.state == "start":
            stripped = self.pending.lstrip()
            if stripped.startswith(OPEN):
                self.state, self.pending, self.thought = "thinking", stripped[len(OPEN):], True
            elif OPEN.startswith(stripped):
                return out  # not decided yet
            else:
                self.state = "text"
        if self.state == "thinking":
            before, sep, after = self.pending.partition(CLOSE)
            keep = 0 if sep else _held(before, CLOSE)
            if before[:len(before) - keep]:
                out.append(("thinking", before[:len(before) - keep]))
            if not sep:
                self.pending = before[len(before) - keep:]
                return out
            self.state, self.pending = "after", after
        if self.state == "after":  # the newlines between the thinking and the text
            self.pending = self.pending.lstrip("\n")
            if not self.pending:
                return out
            self.state = "text"
        if self.pending:
            out.append(("text", self.pending))
            self.pending = ""
        return out

    def flush(self) -> list[tuple[str, str]]:
        """What is held back at the end of the answer."""
        rest, self.pending = self.pending, ""
        if not rest or self.state == "after":
            return []
        return [("thinking" if self.state == "thinking" else "text", rest)]


def split(text: str) -> tuple[str, str | None]:
    """A whole answer -> (its text, its thinking, or None where it did not open with the tag)."""
    parts = ThinkingSplit()
    pieces = parts.feed(text) + parts.flush()
    thinking = "".join(t for kind, t in pieces if kind == "thinking")
    return "".join(t for kind, t in pieces if kind == "text"), (thinking if parts.thought
                                                                 else None)
