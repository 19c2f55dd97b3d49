"""One request's tokens and blocks as the scheduler sees them (no torch): its prompt, what it has
generated, how many of its tokens already have K/V in the arena, and its block table."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.cache.block_manager import Sequence as BlockTable


class State(enum.Enum):
    WAITING = "waiting"  # not admitted, or preempted: no blocks
    RUNNING = "running"  # has blocks; prefilling or decoding
    FINISHED = "finished"  # ended (length, stop, cancelled, failed): its blocks are back


@dataclass(eq=False)
class Seq:
    id: str
    prompt_ids: list[int]
    max_new_tokens: int
    arrival: int = 0  # admission order: the newest running sequence is preempted first
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # leading tokens whose K/V are in the arena
    table: BlockTable = field(default_factory=BlockTable)
    state: State = State.WAITING
    preemptions: int = 0
    finish_reason: str | None = None
    spec_ids: list[int] = field(default_factory=list)  # proposals for the next step to verify
    # after its pending token (batch/speculative_rows.py); the scheduler takes what fits

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def token_at(self, i: int) -> int:
        """token_ids[i] without building token_ids (a decode row asks every step)."""
        n = len(self.prompt_ids)
        return self.prompt_ids[i] if i < n else self.output_ids[i - n]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_tokens(self) -> int:
        """Positions it can ever need: the prompt and every token it may generate but the last
        (the last sampled token is never fed back)."""
        return len(self.prompt_ids) + self.max_new_tokens - 1

    @property
    def num_pending(self) -> int:
        """Tokens to feed before its next token can be sampled: the rest of the prompt in
        prefill, 1 in decode (the token sampled last)."""
        return self.num_tokens - self.num_computed

    @property
    def done(self) -> bool:
        return len(self.output_ids) >= self.max_new_tokens


@dataclass(frozen=True)
class Chunk:
    """Feed seq.token_ids[start:] then `spec` (proposals), `length` tokens in all, at positions
    start..; `sample`: the chunk ends at the sequence's last token (before its proposals), so
    its logits give the next token. A chunk with proposals is a verify row: the logits of its
    every position are needed, and its rejected positions are simply overwritten later."""

    seq: Seq
    start: int
    length: int
    spec: tuple[int, ...] = ()

    @property
    def sample(self) -> bool:
        return self.start + self.length - len(self.spec) == self.seq.num_tokens

    @property
    def token_ids(self) -> list[int]:
        end = self.start + self.length - len(self.spec)
        return self.seq.token_ids[self.start:end] + list(self.spec)
