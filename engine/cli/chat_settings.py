"""`hearth chat`'s answer settings: the system prompt, the answer's length and the sampling
fields, as the flags start them and `/set NAME VALUE` changes them. Each is an explicit field of
the GenerateRequest; None leaves it to the model (its generation_config.json, else the
engine's default), so nothing here decides a default of its own."""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass

from engine.events import BadRequest, GenerateRequest, SamplingParams

DEFAULT_MAX_TOKENS = 512  # `hearth chat --max-new-tokens`'s default
UNSET = ("default", "none")  # `/set temperature default`: back to the model's own
NAMES = ("temperature", "top_p", "top_k", "repetition_penalty", "max_tokens", "seed", "system")
ALIASES = {"max_new_tokens": "max_tokens"}  # and every name with - for _


@dataclass(frozen=True)
class AnswerSettings:
    system: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float | None = None  # 0 is greedy
    top_p: float | None = None
    top_k: int | None = None  # 0 is off
    repetition_penalty: float | None = None
    seed: int | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AnswerSettings:
        return cls(system=args.system, max_tokens=args.max_new_tokens,
                   temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                   repetition_penalty=args.repetition_penalty, seed=args.seed)

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              repetition_penalty=self.repetition_penalty, seed=self.seed)

    def request(self, messages: tuple[dict, ...]) -> GenerateRequest:
        """The request for `messages` under these settings; BadRequest with one sentence."""
        req = GenerateRequest(messages=messages, system=self.system,
                              max_new_tokens=self.max_tokens, sampling=self.sampling(),
                              stop_on_repetition=True)  # the loop guard, as in the window
        req.validate()
        return req

    def changed(self, command: str) -> AnswerSettings:
        """`/set NAME VALUE` (the text after /set) applied; BadRequest with one sentence for an
        unknown name or a value the engine would refuse, and these settings stay."""
        name, _, text = command.strip().partition(" ")
        key, text = key_of(name), text.strip()
        if key not in NAMES:
            raise BadRequest(f"/set knows {', '.join(NAMES)}, not {name[:40]!r}")
        if key == "system":
            return dataclasses.replace(self, system=text or None)
        if not text:
            raise BadRequest(f"/set {key} needs a value (or `default`)")
        if text.lower() in UNSET:
            default = DEFAULT_MAX_TOKENS if key == "max_tokens" else None
            return dataclasses.replace(self, **{key: default})
        new = dataclasses.replace(self, **{key: _parse(key, text)})
        try:
            new.request(({"role": "user", "content": "check"},))
        except BadRequest as e:
            raise BadRequest(f"{key} stays {self.shown(key)}: {e}") from None
        return new

    def shown(self, key: str) -> str:
        value = getattr(self, key)
        if value is None:
            return "none" if key == "system" else "the model's default"
        return repr(value) if key == "system" else str(value)

    def describe(self) -> str:
        """`/set` alone: every setting, one a line."""
        return "\n".join(f"  {key:<19}{self.shown(key)}" for key in NAMES)


def key_of(name: str) -> str:
    """The setting a name given to /set means: `top-p` and `max_new_tokens` are understood."""
    key = name.lower().replace("-", "_")
    return ALIASES.get(key, key)


def _parse(key: str, text: str) -> float | int:
    whole = key in ("top_k", "max_tokens", "seed")
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise BadRequest(f"{key} takes {kind}, not {text[:40]!r}") from None
    if not whole and not math.isfinite(value):
        raise BadRequest(f"{key} must be a finite number, not {text[:40]}")
    return value
