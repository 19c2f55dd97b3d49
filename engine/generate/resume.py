"""A generation carried between the batch and a session of one, mid-answer (speculation
is a batch of one's: it switches off while others run and back on when one is left).

What moves is everything per request that is not K/V: the tokens so far, the sampler (its seeded
generator and penalty state), the stop matcher's held-back text, the clocks. The K/V stays in the
shared arena: the side that takes the generation over finds its full blocks by hash and computes
only the rest, ending at the last sampled token, whose logits give the next one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # no torch where the service only passes a Resume along
    from engine.generate.detokenizer import StopMatcher
    from engine.step.sampling import Sampler


@dataclass
class Resume:
    prompt_ids: list[int]  # the request's prompt, as built when it started
    generated: list[int]  # every token sampled so far, the last one not yet fed back
    max_new: int  # the request's limit on new tokens, counting `generated`
    sampler: Sampler
    stop: StopMatcher
    t_start: float
    t_first: float | None
    cached: int  # prompt tokens found cached when it started
    dropped: int  # history turns the prompt left out to fit

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.generated


@dataclass(frozen=True)
class Paused:
    """The session's generation stopped at a round boundary to join a batch: `resume` carries it
    on. An engine-internal event; never reaches a client."""

    resume: Resume
