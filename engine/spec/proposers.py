"""Where speculative tokens come from besides a draft model (spec/draft_rows.py): prompt
lookup (the latest earlier match of the last few tokens in the conversation so far), and the
benchmark-only synthetic draft. Each proposes K token ids on the device and, where they were
sampled, the distributions they were drawn from; verification is spec/speculative.py's.

Every proposer sees `seq`: the committed tokens, the pending one (not yet fed) last.
"""

from __future__ import annotations

import random

import torch

from engine.events import BadRequest
from engine.step.sampling import Sampler

PROMPT_LOOKUP_NGRAMS = (3, 2, 1)  # the longest suffix that matches earlier decides


def check_same_tokenizer(target_tok, draft_tok, draft_path: str) -> None:
    """A draft's ids must mean the target's tokens: compare the vocabularies token by token
    (not vocab_size: models that share a tokenizer may pad their embeddings differently)."""
    a, b = target_tok.get_vocab(), draft_tok.get_vocab()
    if a != b:
        differ = sum(b.get(tok) != i for tok, i in a.items()) + len(set(b) - set(a))
        raise BadRequest(f"the draft model {draft_path} has another tokenizer than the target "
                         f"({differ} of {len(a)} tokens differ); a draft must share the "
                         "target's tokenizer")


class PromptLookup:
    """No model: propose what followed the latest earlier occurrence of the sequence's last n
    tokens (n = 3, 2, 1, longest first). An index of n-grams keeps each lookup O(1)."""

    name = "prompt_lookup"

    def __init__(self, device: torch.device):
        self.device = device
        self.index: dict[int, dict[tuple[int, ...], int]] = {}
        self.indexed = 0

    def start(self, ids: list[int]) -> None:
        self.index = {n: {} for n in PROMPT_LOOKUP_NGRAMS}
        self.indexed = 0

    def _extend(self, seq: list[int]) -> None:
        # an entry maps an n-gram to the position of the token that followed it (latest wins)
        for e in range(max(self.indexed, 1), len(seq)):
            for n, table in self.index.items():
                if e >= n:
                    table[tuple(seq[e - n:e])] = e
        self.indexed = max(self.indexed, len(seq))

    def propose(self, seq: list[int], k: int, sampler: Sampler, grammar=None):
        """The tokens that followed the match (a grammar checks them after: verify's caller)."""
        self._extend(seq)
        for n, table in self.index.items():
            e = table.get(tuple(seq[-n:]))
            if e is not None:
                found = seq[e:e + k]
                return torch.tensor(found, dtype=torch.long, device=self.device), None
        return None, None

    def commit(self, accepted: list[int], proposed: int) -> None:
        pass


class SyntheticDraft:
    """Benchmark only (`hearth bench --synthetic-acceptance A`): the real draft runs for its
    cost (the batch's draft rows, spec/draft_rows.py), but its proposals are replaced by the
    target's own greedy continuation (`reference`: a plain greedy run's prompt and output), each
    token wrong with probability 1 - A, so the acceptance rate is A by construction. Greedy
    decoding only (generate/generation.py refuses the rest)."""

    name = "synthetic"

    def __init__(self, vocab: int, device: torch.device, acceptance: float, seed: int = 0):
        self.vocab, self.device = vocab, device
        self.acceptance = acceptance
        self.rng = random.Random(seed)
        self.reference: list[int] = []

    def replace(self, start: int, k: int) -> torch.Tensor:
        """K proposals for positions start.. in place of the draft's [k]."""
        chosen = []
        for i in range(start, start + k):
            right = self.reference[i] if i < len(self.reference) else 0
            wrong = (right + 1) % self.vocab
            chosen.append(right if self.rng.random() < self.acceptance else wrong)
        return torch.tensor(chosen, dtype=torch.long, device=self.device)
