"""The generation loop's plain strategy: one target step per token (spec/speculative.py holds the
other, SpeculativeDecoding)."""

from __future__ import annotations

import torch

from engine.cache.kv_cache import KVCache
from engine.step.decode import Decoder
from engine.step.sampling import Sampler


class PlainDecoding:
    """One target step per token: the loop's fast path (speculative.SpeculativeDecoding is the
    other strategy). `next` feeds the pending token and returns the next one."""

    def __init__(self, decoder: Decoder, cache: KVCache, sampler: Sampler):
        self.decoder, self.cache, self.sampler = decoder, cache, sampler

    def first(self, logits: torch.Tensor) -> list[int]:
        self.token = self.sampler(logits)  # [1] on the device
        self.last = int(self.token.item())  # the one host sync a step needs: the text is shown now
        return [self.last]

    def next(self, position: int, budget: int) -> list[int]:
        logits = self.decoder.step(self.token, position)
        self.cache.token_ids.append(self.last)
        return self.first(logits)

    def stats(self) -> dict:
        return {}
