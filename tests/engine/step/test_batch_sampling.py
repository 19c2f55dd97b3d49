"""Per-row sampling for batched steps: every row's token is what its request's Sampler chooses
alone, step after step, whatever else is in the batch and in whatever order (greedy, seeded
sampling with temperature, top-k, top-p and a repetition penalty)."""

from __future__ import annotations

import random

import pytest
import torch

from engine.step.batch_sampling import sample_rows
from engine.step.sampling import ResolvedSampling, Sampler

V = 97
SETTINGS = [ResolvedSampling(0.0, 1.0, 0, 1.0, 1),  # greedy
            ResolvedSampling(0.0, 1.0, 0, 1.3, 2),  # greedy with a penalty
            ResolvedSampling(0.8, 0.9, 0, 1.0, 3),  # top-p
            ResolvedSampling(1.2, 1.0, 5, 1.0, 4),  # top-k
            ResolvedSampling(0.7, 0.95, 20, 1.1, 5)]  # all of them


def _sampler(s: ResolvedSampling) -> Sampler:
    return Sampler(s, V, torch.device("cpu"), torch.tensor([3, 5, 7]))


def _logits(step: int, request: int) -> torch.Tensor:
    """Request `request`'s logits at `step`: the same wherever its row sits."""
    g = torch.Generator().manual_seed(1000 * step + request)
    return torch.randn(V, generator=g) * 3


def test_each_row_gets_what_its_sampler_chooses_alone():
    alone = {r: [] for r in range(len(SETTINGS))}
    for r, s in enumerate(SETTINGS):
        sampler = _sampler(s)
        for step in range(12):
            alone[r].append(int(sampler(_logits(step, r))[0]))
    rng = random.Random(0)
    for trial in range(4):  # other batches: subsets in shuffled orders, with a stranger row
        members = rng.sample(range(len(SETTINGS)), rng.randint(1, len(SETTINGS)))
        samplers = {r: _sampler(SETTINGS[r]) for r in members}
        stranger = _sampler(ResolvedSampling(1.0, 1.0, 0, 1.0, 99 + trial))
        for step in range(12):
            order = members[:]
            rng.shuffle(order)
            rows = torch.stack([_logits(step, r) for r in order]
                               + [torch.randn(V, generator=torch.Generator().manual_seed(step))])
            got = sample_rows([samplers[r] for r in order] + [stranger], rows)
            assert got.shape == (len(order) + 1,) and got.dtype == torch.long
            for i, r in enumerate(order):
                assert int(got[i]) == alone[r][step], (trial, step, r)


def test_a_penalized_row_marks_what_it_chose():
    s = _sampler(ResolvedSampling(0.0, 1.0, 0, 1.5, 1))
    token = int(sample_rows([s], _logits(0, 0)[None])[0])
    assert s.seen[token] and s.seen[3] and int(s.seen.sum()) == 4


def test_rows_and_samplers_must_agree():
    with pytest.raises(ValueError, match="2 rows of logits for 1 samplers"):
        sample_rows([_sampler(SETTINGS[0])], torch.zeros(2, V))
