"""A conversation as the app keeps it: its settings and its messages (plain data, no Qt).
Messages form a tree: a regenerated answer is a sibling of the one before (an alternative),
and the conversation shown is the path through the alternatives shown."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from engine.events import SamplingParams, Stats

ROLES = ("user", "assistant")
# done: complete; streaming: being written now; cancelled: stopped by the user;
# interrupted: the app or the worker died mid-answer; failed: the engine reported an error
STATUSES = ("done", "streaming", "cancelled", "interrupted", "failed")
DEFAULT_TITLE = "New chat"
MAX_TITLE_CHARS = 48
ELLIPSIS = "\u2026"


def title_of(text: str) -> str:
    """A conversation's title from its first message: its words on one line, cut at a word's
    end with an ellipsis when too long (a single overlong word is cut inside)."""
    line = " ".join(text.split())
    if len(line) <= MAX_TITLE_CHARS:
        return line
    cut = line[:MAX_TITLE_CHARS]  # the ellipsis takes the place of the space at the cut
    head = cut.rsplit(" ", 1)[0] if " " in cut else cut[:-1]
    return (head.rstrip(" ,.;:") or cut[:-1]) + ELLIPSIS


@dataclass(frozen=True)
class ChatSettings:
    """Per-conversation settings; None leaves a value to the model's default (its
    generation_config.json, else its family's preset: engine/formats/sampling_defaults.py)."""

    system_prompt: str = ""
    max_new_tokens: int = 1024
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              repetition_penalty=self.repetition_penalty, seed=self.seed)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | None) -> ChatSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        obj = json.loads(text) if text else {}
        return cls(**{k: v for k, v in obj.items() if k in known})


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    settings: ChatSettings
    updated_at: float


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    role: str
    content: str
    status: str = "done"
    finish_reason: str | None = None
    error: str | None = None
    stats: Stats | None = None
    parent_id: int | None = None  # the message it answers or follows; None: the first
    alternative: int = 1  # its place among its siblings (1-based), for the `< 2/3 >` switcher
    num_alternatives: int = 1
