"""One request's generation inside a BatchRun (generate/batch_run.py): its prompt, checked, its
sequence and what is its own (sampler, detokenizer, stop strings, clocks)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from engine.batch.sequence import Seq
from engine.events import BadRequest, GenerateRequest
from engine.generate import constrained
from engine.generate.detokenizer import StopMatcher, detokenizer_for
from engine.generate.prompt import build as build_prompt
from engine.step.sampling import Sampler


class CheckedPrompt(NamedTuple):
    ids: list[int]
    tensor: torch.Tensor  # ids on the device
    dropped: int  # oldest messages left out to fit the context
    max_new: int  # the new tokens it may have
    sampler: Sampler


def checked_prompt(lm, req: GenerateRequest, history: list[int],
                   cancel: threading.Event | None = None) -> CheckedPrompt:
    """The request's prompt on the loaded model `lm` (generate/prompt.py, keeping `history`'s
    ids where it repeats them), refused as bad input where it cannot run, with its Sampler."""
    ids, dropped = build_prompt(lm.tokenizer, req, history, lm.context, cancel)
    vocab = lm.model.config.vocab_size
    if not ids:
        raise BadRequest("the prompt is empty")
    if req.prompt_ids is not None and max(ids) >= vocab:
        raise BadRequest(f"prompt_ids holds a token id past the vocabulary's {vocab:,}")
    if len(ids) >= lm.context:
        raise BadRequest(f"the prompt has {len(ids)} tokens but the context holds "
                         f"{lm.context}")
    tensor = torch.tensor(ids, dtype=torch.long, device=lm.device)  # one copy, two uses
    sampler = constrained.sampler(lm, req, vocab, tensor)
    return CheckedPrompt(ids, tensor, dropped, min(req.max_new_tokens, lm.context - len(ids)),
                         sampler)


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
    ids, _, dropped, max_new, sampler = checked_prompt(session.lm, req, history, cancel)
    if getattr(session, "synthetic", None) is not None and not sampler.s.is_greedy:
        raise BadRequest("the synthetic draft measures greedy decoding only")
    return Generation(Seq(seq_id, list(ids), max_new), req, sink, cancel, sampler,
                      detokenizer_for(session.lm.tokenizer, ids), StopMatcher(req.stop), 0,
                      dropped, t_start)

