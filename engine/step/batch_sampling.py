"""The next token of every row of a batched step, each row by its own request's Sampler
(step/sampling.py): its temperature, top-p, top-k, penalties, logit_bias, logprobs and seeded
generator. A row's token is the one its Sampler would choose alone, whatever else shares the
batch: a seeded request gives the same tokens in any batch. Plain greedy rows (no penalty, no
bias, no logprobs) take one argmax together (argmax reads each row on its own); the others draw
one by one, each from its own generator, so no row's draws depend on the rows beside it
(batch_run.py's steps)."""

from __future__ import annotations

import torch

from engine.step.sampling import Sampler


def sample_rows(samplers: list[Sampler], logits: torch.Tensor) -> torch.Tensor:
    """logits: [B, V], row i for samplers[i] -> next tokens [B] int64 on logits' device. Each
    Sampler's state (its generator, its seen set) advances as one call of its own would."""
    if logits.shape[0] != len(samplers):
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(samplers)} samplers")
    plain = [i for i, s in enumerate(samplers) if s.is_plain_greedy]
    if len(plain) == len(samplers):  # no index tensor: a host-to-device copy waits for the GPU
        return logits.float().argmax(-1)
    out = torch.empty(len(samplers), dtype=torch.long, device=logits.device)
    if plain:
        rows = torch.tensor(plain, device=logits.device)
        out[rows] = logits[rows].float().argmax(-1)
    for i, sampler in enumerate(samplers):
        if not sampler.is_plain_greedy:
            out[i] = sampler(logits[i])[0]
    return out
