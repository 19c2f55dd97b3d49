"""Choosing the next token on the device: greedy, temperature, top-k, top-p, repetition penalty.

No host sync inside `Sampler.__call__`: the draw is argmax(probs / Exp(1)) with a seeded device
generator (the exponential race, equivalent to sampling from probs), so a step never waits on
the CPU. The order of the transforms follows transformers' `generate()`: penalty, temperature,
top-k, top-p.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ResolvedSampling:
    """Sampling with every default filled in. temperature 0 is greedy."""

    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    seed: int

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


ENGINE_DEFAULTS = dict(temperature=0.7, top_p=0.95, top_k=0, repetition_penalty=1.0)


def resolve(params, gen_config: dict) -> ResolvedSampling:
    """Request value, else generation_config.json's, else the engine's default."""
    model = {}
    if gen_config.get("do_sample") is False:
        model["temperature"] = 0.0
    elif gen_config.get("do_sample"):
        for key in ("temperature", "top_p", "top_k", "repetition_penalty"):
            if gen_config.get(key) is not None:
                model[key] = gen_config[key]
    if gen_config.get("repetition_penalty") is not None:
        model["repetition_penalty"] = gen_config["repetition_penalty"]

    def pick(key):
        value = getattr(params, key)
        return value if value is not None else model.get(key, ENGINE_DEFAULTS[key])

    seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(4), "little")
    return ResolvedSampling(float(pick("temperature")), float(pick("top_p")),
                            int(pick("top_k")), float(pick("repetition_penalty")), seed)


class Sampler:
    """One per generation: holds the seeded generator and the seen-token mask for the penalty."""

    def __init__(self, s: ResolvedSampling, vocab_size: int, device: torch.device,
                 prompt_ids: torch.Tensor):
        self.s = s
        self.generator = torch.Generator(device=device).manual_seed(s.seed)
        self.seen = None
        if s.repetition_penalty != 1.0:
            self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            self.seen[prompt_ids] = True

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [V] for the last position -> next token id, [1] int64 on the device."""
        logits = logits.float()
        if self.seen is not None:
            # CTRL-style penalty as in transformers: divide positive logits, multiply negatives
            p = self.s.repetition_penalty
            penalized = torch.where(logits > 0, logits / p, logits * p)
            logits = torch.where(self.seen, penalized, logits)
        if self.s.is_greedy:
            token = logits.argmax(-1, keepdim=True)
        else:
            token = self._draw(logits)
        if self.seen is not None:
            self.seen[token] = True
        return token

    def _draw(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits / self.s.temperature
        if 0 < self.s.top_k < logits.numel():
            kth = torch.topk(logits, self.s.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.s.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=False)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            drop_sorted = cum <= 1 - self.s.top_p  # the low tail whose mass is below 1 - p
            drop_sorted[-1] = False  # always keep the most likely token
            drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        probs = logits.softmax(-1)
        race = torch.empty_like(probs).exponential_(1, generator=self.generator)
        return (probs / race).argmax(-1, keepdim=True)
