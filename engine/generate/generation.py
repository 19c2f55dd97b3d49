"""One request's generation inside a BatchRun (generate/batch_run.py): its sequence and what is
its own (sampler, detokenizer, stop strings, clocks, the last sampled token on the device)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.batch.sequence import Seq
from engine.events import GenerateRequest
from engine.generate.detokenizer import StopMatcher
from engine.step.sampling import Sampler


@dataclass(eq=False)
class Generation:
    """One request's generation: its sequence and everything per request."""

    seq: Seq
    req: GenerateRequest
    sink: Callable[[object], None]
    cancel: threading.Event
    sampler: Sampler
    detok: object
    stop: StopMatcher
    cached: int  # prompt tokens whose K/V were found cached at admission
    dropped: int
    t_start: float
    t_first: float | None = None
    last_stats: float = 0.0
    n_new: int = 0
    token: torch.Tensor | None = None  # the last sampled token on the device [1]
    admitted: bool = False
