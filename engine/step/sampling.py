"""Choosing the next token on the device: greedy, temperature, top-k, top-p, repetition penalty.

No host sync inside `Sampler.__call__`: the draw is argmax(probs / Exp(1)) with a seeded device
generator (the exponential race, equivalent to sampling from probs), so a step never waits on
the CPU. The order of the transforms follows transformers' `generate()`: penalty, temperature,
top-k, top-p; OpenAI's penalties and logit_bias (step/penalties.py) come after the repetition
penalty, and logprobs (step/logprobs.py) are of the raw logits, before all of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from engine.events import Token
from engine.step.logprobs import LogprobRecorder, token_event
from engine.step.penalties import OpenAIPenalties, proposal_counts


@dataclass(frozen=True)
class ResolvedSampling:
    """Sampling with every default filled in. temperature 0 is greedy."""

    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    seed: int
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None  # top tokens reported beside each chosen one; None: none

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


def resolve(params, defaults: dict) -> ResolvedSampling:
    """The request's value for each setting, else the model's default (`defaults`: formats/
    sampling_defaults.py model_defaults, the values the window shows); no seed: a random one."""
    def pick(key):
        value = getattr(params, key)
        return value if value is not None else defaults[key]

    seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(4), "little")
    return ResolvedSampling(float(pick("temperature")), float(pick("top_p")),
                            int(pick("top_k")), float(pick("repetition_penalty")), seed,
                            **openai_options(params))


def openai_options(params) -> dict:
    """The options OpenAI's API adds (they have no model default)."""
    return {"presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty, "logit_bias": params.logit_bias,
            "logprobs": params.logprobs}


class Sampler:
    """One per generation: holds the seeded generator and the seen-token mask for the penalty,
    and a constrained request's grammar state (grammar/matcher.py; None: unconstrained)."""

    grammar = None  # a GrammarState, set by the generation that makes this Sampler

    def __init__(self, s: ResolvedSampling, vocab_size: int, device: torch.device,
                 prompt_ids: torch.Tensor):
        self.s = s
        self.generator = torch.Generator(device=device).manual_seed(s.seed)
        self.seen = None
        if s.repetition_penalty != 1.0:
            self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            self.seen[prompt_ids] = True
        self.rules = OpenAIPenalties.of(s, vocab_size, device)
        self.logprobs = None if s.logprobs is None else LogprobRecorder(s.logprobs, device)

    @property
    def is_plain_greedy(self) -> bool:
        """Greedy with nothing of its own to apply or record: argmax of the raw logits."""
        return (self.s.is_greedy and self.seen is None and self.rules is None
                and self.logprobs is None)

    @property
    def one_token_a_step(self) -> bool:
        """Whether this request decodes without speculation: its logprobs are recorded a step
        at a time, and its grammar's next mask depends on each token taken."""
        return self.logprobs is not None or self.grammar is not None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [V] for the last position -> next token id, [1] int64 on the device."""
        raw = logits
        logits = self.penalize(self.constrain(logits.float()), self.seen)
        if self.rules is not None:
            logits = self.rules.apply(logits)
        if self.s.is_greedy:
            token = logits.argmax(-1, keepdim=True)
        else:
            token = self.race(self.filter(logits).softmax(-1))
        if self.seen is not None:
            self.seen[token] = True
        if self.rules is not None:
            self.rules.add(token)
        if self.logprobs is not None:
            self.logprobs.record(raw, token)
        self.follow(token)
        return token

    def token(self, text: str, ids) -> Token:
        """The Token event of ids this sampler chose, oldest first, with their logprobs where
        the request asked for them (a request with logprobs decodes plainly, a token a step)."""
        return token_event(text, ids, self.logprobs)

    def constrain(self, logits: torch.Tensor) -> torch.Tensor:
        """[V] logits with what the grammar does not allow next at -inf (unconstrained: as is)."""
        if self.grammar is None:
            return logits
        return logits.masked_fill(~self.grammar.allowed(logits.device), float("-inf"))

    def follow(self, token: torch.Tensor) -> None:
        """The grammar takes the chosen token: the next mask depends on it, so a constrained
        request reads its token on the host here (one sync a step, for it alone)."""
        if self.grammar is not None:
            self.grammar.accept(int(token.reshape(-1)[0].item()))

    def penalize(self, logits: torch.Tensor, seen: torch.Tensor | None) -> torch.Tensor:
        """logits, seen: [..., V] (seen broadcasts); None or a penalty of 1: unchanged."""
        if seen is None:
            return logits
        # CTRL-style penalty as in transformers: divide positive logits, multiply negatives
        p = self.s.repetition_penalty
        penalized = torch.where(logits > 0, logits / p, logits * p)
        return torch.where(seen, penalized, logits)

    def filter(self, logits: torch.Tensor) -> torch.Tensor:
        """Temperature, top-k, top-p over the last dim of [..., V] float logits."""
        logits = logits / self.s.temperature
        if 0 < self.s.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.s.top_k).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.s.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=False)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            drop_sorted = cum <= 1 - self.s.top_p  # the low tail whose mass is below 1 - p
            drop_sorted[..., -1] = False  # always keep the most likely token
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        return logits

    def race(self, weights: torch.Tensor) -> torch.Tensor:
        """A draw proportional to weights [V] (need not sum to 1) -> [1]: argmax(w / Exp(1))."""
        race = torch.empty_like(weights).exponential_(1, generator=self.generator)
        return (weights / race).argmax(-1, keepdim=True)

    # ------------------------------------------------ speculative blocks (spec/speculative.py)

    def block_seen(self, proposals: torch.Tensor) -> torch.Tensor | None:
        """The penalty's seen mask for each of the K + 1 verified positions, [K + 1, V]: row i
        also holds proposals[:i], the tokens that precede position i if accepted."""
        if self.seen is None:
            return None
        return self.seen | (proposal_counts(proposals, self.seen.numel()) > 0)

    def target_logits(self, logits: torch.Tensor, proposals: torch.Tensor) -> torch.Tensor:
        """Verified logits [K + 1, V] -> the target's next-token logits at each position, as
        __call__ would see them there (penalty, and for sampling temperature, top-k, top-p)."""
        logits = self.penalize(logits.float(), self.block_seen(proposals))
        if self.rules is not None:
            logits = self.rules.apply(logits, self.rules.block_counts(proposals))
        return logits if self.s.is_greedy else self.filter(logits)

    def mark(self, tokens: list[int]) -> None:
        """Committed tokens join the penalty's seen set."""
        if self.seen is not None and tokens:
            self.seen[torch.tensor(tokens, device=self.seen.device)] = True
        if self.rules is not None and tokens:
            self.rules.add(torch.tensor(tokens, device=self.rules.device))
