"""Logprobs and OpenAI's penalties on a GPU (the GPU machine runs these): records copied to
pinned host memory while later steps run, read in order after several steps, equal the
log_softmax of each step's raw logits; penalised greedy choices equal the same sampler's on the
CPU."""

from __future__ import annotations

import pytest
import torch

from engine.step.sampling import ResolvedSampling, Sampler

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
V = 1000


@GPU
def test_logprobs_read_after_later_steps_are_each_steps_own():
    s = ResolvedSampling(0.0, 1.0, 0, 1.0, 0, 0.4, 0.7, ((5, 2.0),), 4)
    cuda = Sampler(s, V, torch.device("cuda"), torch.tensor([1, 2], device="cuda"))
    cpu = Sampler(s, V, torch.device("cpu"), torch.tensor([1, 2]))
    steps = [torch.randn(V, generator=torch.Generator().manual_seed(i)) * 2 for i in range(6)]
    chosen = []
    for logits in steps:  # three steps recorded before any is read, as a batch's in-flight step
        token = cuda(logits.to("cuda", torch.bfloat16))
        assert int(token) == int(cpu(logits.to(torch.bfloat16)))
        chosen.append(int(token))
    records = cuda.token("", chosen[:3]).logprobs + cuda.token("", chosen[3:]).logprobs
    for logits, token, (logprob, top) in zip(steps, chosen, records, strict=True):
        expected = logits.to(torch.bfloat16).float().log_softmax(-1)
        assert logprob == pytest.approx(expected[token].item(), abs=1e-5)
        want = expected.topk(4)  # bf16 logits tie often: tied entries come in either order
        assert [v for _, v in top] == pytest.approx(want.values.tolist(), abs=1e-5)
        assert len({t for t, _ in top}) == 4
        assert [expected[t].item() for t, _ in top] == pytest.approx([v for _, v in top],
                                                                       abs=1e-5)
