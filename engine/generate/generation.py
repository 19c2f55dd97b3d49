"""One request's generation inside a BatchRun (generate/batch_run.py): its sequence and what is
its own (sampler, detokenizer, stop strings, clocks)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.batch.sequence import Seq
from engine.events import BadRequest, GenerateRequest
from engine.generate.detokenizer import StopMatcher, detokenizer_for
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
    admitted: bool = False


def new_generation(session, seq_id: str, req: GenerateRequest, sink, cancel: threading.Event,
                   history: list[int]) -> Generation:
    """A request's generation in a batch of `session` (raises BadRequest for bad input)."""
    req.validate()
    if req.num_speculative_tokens and not req.prompt_lookup and session.draft is None:
        raise BadRequest("speculative tokens need a draft model (--draft) or prompt lookup")
    # prompt lookup and a draft model speculate in the batch (batch/speculative_rows.py)
    t_start = time.perf_counter()
    ids, _, dropped, max_new, sampler = session.checked_prompt(req, history, cancel)
    return Generation(Seq(seq_id, list(ids), max_new), req, sink, cancel, sampler,
                      detokenizer_for(session.lm.tokenizer, ids), StopMatcher(req.stop), 0,
                      dropped, t_start)

