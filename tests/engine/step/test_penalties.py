"""OpenAI's penalties and logit_bias in the device sampler against the formula written out:
logit[j] - count[j] * frequency - (count[j] > 0) * presence + bias[j], where count is over the
generated tokens only (never the prompt's), and a speculative block's target logits see, at each
position, the counts that the plain sampler would see there."""

from __future__ import annotations

import torch

from engine.step.sampling import ResolvedSampling, Sampler

V = 61
PROMPT = torch.tensor([1, 2, 3])


def sampler(frequency=0.0, presence=0.0, bias=(), temperature=0.0, seed=0) -> Sampler:
    s = ResolvedSampling(temperature, 1.0, 0, 1.0, seed, presence, frequency, tuple(bias))
    return Sampler(s, V, torch.device("cpu"), PROMPT)


def step_logits(step: int) -> torch.Tensor:
    # a narrow spread: the penalties decide often
    return torch.randn(V, generator=torch.Generator().manual_seed(step)) * 0.5


def test_greedy_penalties_and_bias_follow_the_formula_step_by_step():
    for frequency, presence in ((0.6, 0.3), (-0.4, 0.9), (2.0, -2.0)):
        bias = {7: 1.5, 1: -0.5}
        s = sampler(frequency, presence, bias.items())
        counts = torch.zeros(V)
        chosen = []
        for step in range(40):
            logits = step_logits(step)
            expected = logits - counts * frequency - (counts > 0).float() * presence
            expected[7] += 1.5
            expected[1] -= 0.5
            token = int(s(logits)[0])
            assert token == int(expected.argmax()), (frequency, presence, step)
            counts[token] += 1
            chosen.append(token)
        assert len(set(chosen)) > 1 and max(chosen.count(t) for t in chosen) > 1  # it decided


def test_the_prompt_does_not_count():
    s = sampler(frequency=2.0, presence=2.0)
    logits = torch.full((V,), -1.0)
    logits[2] = 1.0  # a prompt token: no penalty until it is generated
    assert int(s(logits)[0]) == 2
    assert int(s(logits)[0]) != 2  # now it counts: 1 - 2 - 2 < -1


def test_a_bias_of_100_forces_a_token_and_minus_100_forbids_it():
    for temperature in (0.0, 1.0):
        forced = sampler(bias=[(9, 100.0)], temperature=temperature, seed=4)
        banned = sampler(bias=[(t, -100.0) for t in range(V - 1)], temperature=temperature)
        for step in range(20):
            assert int(forced(step_logits(step) * 4)[0]) == 9
            assert int(banned(step_logits(step) * 4)[0]) == V - 1


def test_a_speculative_blocks_target_logits_see_the_counts_of_each_position():
    s = sampler(0.7, 0.4, [(3, 0.5)])
    for step in range(5):
        s(step_logits(step))
    proposals = torch.tensor([4, 4, 9])
    logits = torch.stack([step_logits(100 + i) for i in range(4)])
    block = s.target_logits(logits, proposals)
    counts = s.rules.counts.clone()
    for i in range(4):
        expected = logits[i] - counts * 0.7 - (counts > 0).float() * 0.4
        expected[3] += 0.5
        torch.testing.assert_close(block[i], expected)
        if i < 3:
            counts[proposals[i]] += 1
    s.mark([4, 4])
    torch.testing.assert_close(s.rules.counts, counts - torch.eye(V)[9])
