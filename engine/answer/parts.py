"""The parts an answer's text is read into, in the order they appear: each a piece of a stream
(a delta), and all of them together the whole message."""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass

ID_CHARS = string.ascii_letters + string.digits


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class Reasoning:
    text: str


@dataclass(frozen=True)
class CallStart:
    """A tool call's first delta: its place among the answer's calls, its id and function."""
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    """A fragment of the call's arguments, a JSON text: the fragments joined are all of it."""
    index: int
    text: str


def call_id(length: int = 24) -> str:
    """OpenAI's shape (`call_` and random letters and digits); Mistral's templates want exactly
    nine letters and digits, and get `length=9` without the prefix."""
    body = "".join(secrets.choice(ID_CHARS) for _ in range(length))
    return body if length == 9 else f"call_{body}"


@dataclass
class Message:
    """Every part of an answer gathered: what a whole (non-streamed) response carries."""
    content: str = ""
    reasoning: str = ""
    calls: list[dict] | None = None

    def add(self, part) -> None:
        if isinstance(part, Content):
            self.content += part.text
        elif isinstance(part, Reasoning):
            self.reasoning += part.text
        elif isinstance(part, CallStart):
            self.calls = self.calls or []
            self.calls.append({"id": part.id, "type": "function",
                               "function": {"name": part.name, "arguments": ""}})
        elif isinstance(part, CallArguments):
            self.calls[part.index]["function"]["arguments"] += part.text
