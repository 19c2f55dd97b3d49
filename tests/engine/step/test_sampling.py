"""The device sampler against obvious references: top-k 1 and a tiny top-p are greedy, the
penalty follows transformers' rule, the draw follows the distribution, defaults come from
generation_config.json."""

from __future__ import annotations

import torch

from engine.events import SamplingParams
from engine.formats.sampling_defaults import model_defaults
from engine.step.sampling import ResolvedSampling, Sampler, resolve


def sampler(temperature=1.0, top_p=1.0, top_k=0, penalty=1.0, seed=0, prompt=(0,)):
    s = ResolvedSampling(temperature, top_p, top_k, penalty, seed)
    return Sampler(s, 50, torch.device("cpu"), torch.tensor(prompt))


def test_top_k_one_and_tiny_top_p_are_greedy():
    for seed in range(20):
        logits = torch.randn(50, generator=torch.Generator().manual_seed(seed))
        best = logits.argmax().item()
        assert sampler(top_k=1, seed=seed)(logits).item() == best
        assert sampler(top_p=1e-6, seed=seed)(logits).item() == best


def test_top_k_never_leaves_the_k_best():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(3))
    allowed = set(logits.topk(5).indices.tolist())
    s = sampler(top_k=5, seed=1)
    assert {s(logits).item() for _ in range(300)} <= allowed


def test_draws_follow_the_distribution():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0] + [-30.0] * 46)
    s = sampler(seed=5)
    counts = torch.bincount(torch.cat([s(logits) for _ in range(4000)]), minlength=50)
    expected = logits.softmax(-1) * 4000
    assert counts[4:].sum() == 0
    assert ((counts[:4].float() - expected[:4]).abs() / expected[:4]).max() < 0.1


def test_repetition_penalty_follows_transformers():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    logits = torch.randn(50, generator=torch.Generator().manual_seed(9))
    prompt = [3, 7, 7, 11]
    ref = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt]), logits[None].clone())[0]
    s = sampler(temperature=0.0, penalty=1.3, prompt=prompt)
    assert s(logits).item() == ref.argmax().item()
    pushed = logits.clone()
    pushed[prompt] += 100.0  # every prompt token leads; the penalty must keep them in order
    assert s(pushed).item() == RepetitionPenaltyLogitsProcessor(1.3)(
        torch.tensor([prompt]), pushed[None].clone())[0].argmax().item()


def test_defaults_come_from_generation_config():
    gen = {"do_sample": True, "temperature": 0.6, "top_p": 0.8, "top_k": 20,
           "repetition_penalty": 1.05}
    r = resolve(SamplingParams(seed=1), model_defaults(gen, "llama"))
    assert (r.temperature, r.top_p, r.top_k, r.repetition_penalty) == (0.6, 0.8, 20, 1.05)
    assert resolve(SamplingParams(seed=1), model_defaults({"do_sample": False}, "qwen2")).is_greedy
    assert resolve(SamplingParams(temperature=0.9, seed=1),
                   model_defaults(gen, "llama")).temperature == 0.9
