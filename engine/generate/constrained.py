"""A request's Sampler, with its grammar where the request has one (GenerateRequest.grammar:
a JSON schema, json_object, a regex, a Lark grammar). The grammar compiles here at the latest
(cached: the server compiled it on its own thread already), so a grammar that cannot compile is
bad input before the request takes a row. A constrained request never speculates: its mask
follows each token as the sampler takes it (generate/session.py _decoding, batch_run.hand_off)."""

from __future__ import annotations

import torch

from engine.events import GenerateRequest
from engine.grammar.matcher import GrammarState
from engine.step.sampling import Sampler, resolve


def sampler(lm, req: GenerateRequest, vocab: int, prompt: torch.Tensor) -> Sampler:
    """The Sampler of `req` on the loaded model `lm` (vocab: its logits' width)."""
    made = Sampler(resolve(req.sampling, lm.sampling_defaults), vocab, lm.device, prompt)
    if req.grammar is not None:
        made.grammar = GrammarState(lm.tokenizer, vocab, req.grammar, tuple(lm.eos_ids))
    return made


def complete(made: Sampler | None, n_new: int) -> bool:
    """Whether the answer's grammar was complete at its n_new-th token: it ends there."""
    grammar = made.grammar if made is not None else None
    return grammar is not None and grammar.complete_after(n_new)
