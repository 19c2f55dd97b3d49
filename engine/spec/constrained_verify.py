"""Speculation under a grammar: a constrained request's matcher over one round's drafted block.

The grammar's next mask depends on every token before it, so a verified position's mask is the
grammar's state after the drafted prefix before that position. The round therefore has the
matcher take the drafted tokens one by one (a draft model drafts under the mask, each token
read on the host; another proposer's tokens are checked, and the draft is cut at the first one
the grammar forbids or once the grammar is complete), keeps the mask it had before each, and
after the verify pass rolls the matcher back to the accepted length and has it take the target's
own token. The verify pass masks each position's logits as a plain step would, so the accepted
tokens are those plain constrained decoding gives (greedy: token for token).

Only allowed tokens are ever drafted or kept, so the accept rule stays exact when sampling: a
forbidden proposal would be rejected for certain, and cutting a sampled draft there, after
seeing it, would bias the token drawn in its place.
"""

from __future__ import annotations

import torch

from engine.grammar.matcher import GrammarState, unpack


class DraftedGrammar:
    """The grammar of one round: `take` the drafted tokens in order, verify with `masks`,
    then `settle` on the accepted length."""

    def __init__(self, grammar: GrammarState):
        self.grammar = grammar
        self.before: list[torch.Tensor] = []  # the packed mask before each taken token

    @property
    def taken(self) -> int:
        return len(self.before)

    @property
    def open(self) -> bool:
        """Whether a further drafted token can follow (not past the answer's end)."""
        return not self.grammar.stopped

    def constrain(self, logits: torch.Tensor) -> torch.Tensor:
        """A draft's logits [V] for the next drafted position, what the grammar forbids there
        at -inf."""
        return logits.masked_fill(~self.grammar.allowed(logits.device), float("-inf"))

    def take(self, token: int) -> bool:
        """The matcher takes the next drafted token, if the grammar allows it there."""
        if not self.open or not self.grammar.allows(token):
            return False
        self.before.append(self.grammar.bits())
        self.grammar.accept(token)
        return True

    def check(self, proposals: torch.Tensor, q: torch.Tensor | None):
        """proposals [K] (and their distributions [K, V] or None) -> the same cut before the
        first token not taken: those a proposer drafted under the grammar are taken already,
        the rest are taken here while the grammar allows them."""
        ids = proposals.tolist()
        n = self.taken
        while n < len(ids) and self.take(ids[n]):
            n += 1
        if n == len(ids):
            return proposals, q
        return proposals[:n], None if q is None else q[:n]

    def masks(self, device: torch.device) -> torch.Tensor:
        """bool [taken + 1, V]: what the grammar allows at each verified position, the one
        after the whole draft last."""
        packed = torch.stack([*self.before, self.grammar.bits()])
        return unpack(packed, self.grammar.vocab_size, device)

    def settle(self, accepted: int, token: int) -> None:
        """The target kept `accepted` drafted tokens then chose `token`: the matcher forgets the
        rejected ones and takes it (not past a complete answer, which ends before it)."""
        self.grammar.rollback(self.taken - accepted)
        del self.before[accepted:]
        if self.open:
            self.grammar.accept(token)
