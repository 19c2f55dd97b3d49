"""OpenAI's logit rules, per request, on the device: presence and frequency penalties over the
tokens generated so far, and logit_bias. Not the repetition penalty (transformers' rule, which
reads the prompt too: step/sampling.py)."""

from __future__ import annotations

import torch

from engine.events import BadRequest


class OpenAIPenalties:
    """OpenAI's rule: logit[j] -= count[j] * frequency + (count[j] > 0) * presence, where count
    is how often j was generated (prompt tokens do not count), then logit[j] += bias[j]. The
    counts grow on the device as tokens are chosen: no host sync."""

    def __init__(self, s, vocab_size: int, device: torch.device):
        self.presence, self.frequency = s.presence_penalty, s.frequency_penalty
        self.device = device
        self.counts = None
        if self.presence or self.frequency:
            self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)
            self._one = torch.ones(1, dtype=torch.float32, device=device)
        self.bias = None
        if s.logit_bias:
            ids = [i for i, _ in s.logit_bias]
            if max(ids) >= vocab_size:
                raise BadRequest(f"logit_bias names token {max(ids)}, past the vocabulary's "
                                 f"{vocab_size:,}")
            bias = torch.zeros(vocab_size, dtype=torch.float32)
            bias[torch.tensor(ids)] = torch.tensor([b for _, b in s.logit_bias])
            self.bias = bias.to(device)

    @classmethod
    def of(cls, s, vocab_size: int, device: torch.device) -> OpenAIPenalties | None:
        """The rules a request asks for; None where it asks for none."""
        if not (s.presence_penalty or s.frequency_penalty or s.logit_bias):
            return None
        return cls(s, vocab_size, device)

    def apply(self, logits: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        """logits [..., V] float -> the same with the rules applied; counts [..., V] (broadcast;
        None: the counts so far)."""
        counts = self.counts if counts is None else counts
        if counts is not None:
            logits = logits - counts * self.frequency - (counts > 0).float() * self.presence
        if self.bias is not None:
            logits = logits + self.bias
        return logits

    def add(self, token: torch.Tensor) -> None:
        """token [1] (or [n]) on the device: chosen, it counts from the next step on."""
        if self.counts is not None:
            self.counts.index_add_(0, token, self._one.expand(token.numel()))

    def block_counts(self, proposals: torch.Tensor) -> torch.Tensor | None:
        """The counts at each of the K + 1 verified positions of a speculative block, [K + 1, V]:
        row i also counts proposals[:i], the tokens that precede position i if accepted."""
        if self.counts is None:
            return None
        return self.counts + proposal_counts(proposals, self.counts.numel())


def proposal_counts(proposals: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """proposals [K] -> [K + 1, V] float: row i counts each token among proposals[:i]."""
    rows = torch.zeros(proposals.numel() + 1, vocab_size, dtype=torch.float32,
                       device=proposals.device)
    if proposals.numel():
        rows[1:].scatter_(1, proposals[:, None], 1.0)  # one_hot would sync to validate
        rows[1:] = rows[1:].cumsum(0)
    return rows
