"""A step's sampled tokens while they are still on the device: the next step is
planned and launched before they reach the host, its decode rows reading them there, so that the
GPU does not wait between steps for the host's planning, inputs and events. Until resolve()
copies them over (one copy, which waits for their step only), each sequence holds UNKNOWN at
their place in its output_ids; nothing reads a token there before then (the scheduler commits
and hashes computed tokens only, and the last sampled token is never computed)."""

from __future__ import annotations

import torch

from engine.batch.sequence import Seq

UNKNOWN = -1


class InFlight:
    def __init__(self):
        self.tokens: torch.Tensor | None = None  # [n] int64 on the device
        self._rows: dict[Seq, tuple[int, int]] = {}  # seq -> (index in tokens, in output_ids)

    def __bool__(self) -> bool:
        return bool(self._rows)

    def hold(self, tokens: torch.Tensor, rows: list[tuple[Seq, int, int]]) -> None:
        """tokens [n]; rows (seq, index in tokens, index of its UNKNOWN in seq.output_ids)."""
        if self._rows:
            raise RuntimeError("the tokens of the step before were never resolved")
        self.tokens = tokens
        self._rows = {seq: (i, at) for seq, i, at in rows}

    def index(self, seq: Seq, position: int) -> int | None:
        """Where in `tokens` the token at `position` of `seq` is, if it is still in flight."""
        row = self._rows.get(seq)
        if row is None or position != len(seq.prompt_ids) + row[1]:
            return None
        return row[0]

    def resolve(self) -> dict[Seq, int]:
        """The tokens on the host (waiting for their step), written into their sequences."""
        if not self._rows:
            return {}
        ids = self.tokens.tolist()
        out = {}
        for seq, (i, at) in self._rows.items():
            seq.output_ids[at] = out[seq] = ids[i]
        self.tokens, self._rows = None, {}
        return out
