"""The next token of every row of a batched step, each row by its own request's Sampler
(step/sampling.py): its temperature, top-p, top-k, penalties, logit_bias, logprobs and seeded
generator. A row's token is the one its Sampler would choose alone, whatever else shares the
batch: a seeded request gives the same tokens in any batch. Plain greedy rows (no penalty, no
bias, no logprobs) take one argmax together (argmax reads each row on its own); the others draw
one by one, each from its own generator, so no row's draws depend on the rows beside it
(batch_run.py's steps). Constrained rows (a grammar) among the plain greedy ones get their masks
in one pass first (grammar/matcher.py masked); the others mask their own row in their Sampler,
which reads the raw logits for logprobs as it does alone."""

from __future__ import annotations

import torch

from engine.grammar.matcher import masked
from engine.step.sampling import Sampler


def sample_rows(samplers: list[Sampler], logits: torch.Tensor) -> torch.Tensor:
    """logits: [B, V], row i for samplers[i] -> next tokens [B] int64 on logits' device. Each
    Sampler's state (its generator, its seen set) advances as one call of its own would."""
    if logits.shape[0] != len(samplers):
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(samplers)} samplers")
    plain = [i for i, s in enumerate(samplers) if s.is_plain_greedy]
    masked = constrain_rows(samplers, logits, plain)  # the plain rows' grammars, in one pass
    if len(plain) == len(samplers):  # no index tensor: a host-to-device copy waits for the GPU
        out = masked.float().argmax(-1)
        follow_rows(samplers, out)
        return out
    out = torch.empty(len(samplers), dtype=torch.long, device=logits.device)
    if plain:
        rows = torch.tensor(plain, device=logits.device)
        out[rows] = masked[rows].float().argmax(-1)
        follow_rows([samplers[i] for i in plain], out[rows])
    for i, sampler in enumerate(samplers):
        if not sampler.is_plain_greedy:
            out[i] = sampler(logits[i])[0]  # masks, penalizes and records as alone
    return out


def constrain_rows(samplers: list[Sampler], logits: torch.Tensor,
                   among: list[int]) -> torch.Tensor:
    """logits with the constrained rows of `among` masked by their grammars, in one pass."""
    rows = [i for i in among if samplers[i].grammar is not None]
    if not rows:
        return logits
    at = torch.tensor(rows, device=logits.device)
    logits = logits.float().clone()
    logits[at] = masked([samplers[i].grammar for i in rows], logits[at])
    return logits


def follow_rows(samplers: list[Sampler], tokens: torch.Tensor) -> None:
    """Each constrained sampler's grammar takes its row's token (one host copy for them all)."""
    rows = [i for i, s in enumerate(samplers) if s.grammar is not None]
    if rows:
        host = tokens.tolist()
        for i in rows:
            samplers[i].grammar.accept(host[i])
