"""One request's grammar state: the matcher follows every token the request accepts, gives the
mask of the tokens allowed next (one bit per token of the model's vocabulary, unpacked on the
logits' device), rolls back N tokens, and says when the grammar is complete.

The mask of a position is computed once (on the host, from the matcher) and kept until the
state moves, so the batched path (step/batch_sampling.py) and the sampler's own call may both
apply it. eos: the model's eos ids (generation_config.json may list several) are allowed exactly
where the grammar allows the tokenizer's eos, that is where the answer is complete."""

from __future__ import annotations

import numpy as np
import torch

from engine.events.grammar_spec import GrammarSpec
from engine.grammar import compiled


class GrammarState:
    """A request's matcher over a vocabulary of vocab_size (the logits' width)."""

    def __init__(self, tokenizer, vocab_size: int, spec: GrammarSpec,
                 eos_ids: tuple[int, ...] = ()):
        self.matcher = compiled.compile(tokenizer, vocab_size, spec).deep_copy()
        self.vocab_size = vocab_size
        self.eos = compiled.tokenizer_for(tokenizer, vocab_size).eos_token
        self.eos_ids = tuple(i for i in eos_ids if 0 <= i < vocab_size)
        self.consumed = 0  # tokens the matcher has taken
        self.complete_at: int | None = None  # consumed when the grammar became complete
        self._bits: torch.Tensor | None = None  # this position's packed mask, int32 [W]

    # ------------------------------------------------------------------ the mask

    def bits(self) -> torch.Tensor:
        """This position's mask packed 32 tokens to an int32 (host), computed once."""
        if self._bits is None:
            words = np.frombuffer(bytearray(self.matcher.compute_bitmask()), dtype=np.uint32)
            if self.eos_ids and (int(words[self.eos // 32]) >> (self.eos % 32)) & 1:
                for i in self.eos_ids:
                    words[i // 32] |= np.uint32(1 << (i % 32))
            self._bits = torch.from_numpy(words.view(np.int32))
        return self._bits

    def allowed(self, device: torch.device) -> torch.Tensor:
        """bool [vocab_size] on device: the tokens the grammar allows next."""
        return unpack(self.bits()[None], self.vocab_size, device)[0]

    # ------------------------------------------------------------------ following tokens

    def accept(self, token: int) -> None:
        """The request took `token` (the sampler's choice, so one the mask allowed)."""
        if token in self.eos_ids:
            token = self.eos  # the matcher knows the tokenizer's eos only
        self.matcher.consume_token(token)
        self.consumed += 1
        self._bits = None
        if self.complete_at is None and self.matcher.is_stopped():
            self.complete_at = self.consumed

    def rollback(self, n: int) -> None:
        """Forget the last n accepted tokens (a rejected speculative block, a recompute)."""
        if n <= 0:
            return
        if not self.matcher.rollback(n):
            raise RuntimeError(f"the grammar cannot roll back {n} tokens: "
                               f"{compiled.one_line(self.matcher.get_error())}")
        self.consumed -= n
        self._bits = None
        if self.complete_at is not None and self.complete_at > self.consumed:
            self.complete_at = None

    def complete_after(self, n: int) -> bool:
        """Whether the grammar was complete once the first n tokens were accepted: the answer
        ends there (a loop gives its tokens out after the sampler has taken the next)."""
        return self.complete_at is not None and n >= self.complete_at

    @property
    def error(self) -> str | None:
        return compiled.one_line(self.matcher.get_error()) if self.matcher.is_error() else None


def unpack(packed: torch.Tensor, vocab_size: int, device: torch.device) -> torch.Tensor:
    """int32 [R, W] packed masks (host) -> bool [R, vocab_size] on device: one copy, then the
    bits taken apart there."""
    words = packed.to(device, non_blocking=False)
    shifts = torch.arange(32, dtype=torch.int32, device=device)
    bits = (words[:, :, None] >> shifts) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab_size].bool()


def masked(states: list[GrammarState], logits: torch.Tensor) -> torch.Tensor:
    """logits [R, V] with row i's disallowed tokens at -inf under states[i], in one pass."""
    packed = torch.stack([s.bits() for s in states])
    allow = unpack(packed, logits.shape[-1], logits.device)
    return logits.masked_fill(~allow, float("-inf"))
