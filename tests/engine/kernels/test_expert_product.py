"""The grouped expert product (kernels/experts): against a per-expert, per-token reference on
the CPU; it reads only the experts the step routes to (the indices it takes from the weights,
counted, are the routed set, each once; the other experts' weights are NaN and nothing turns
NaN); the Triton kernel equals the reference under Triton's interpreter, NaN experts included."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels.experts import grouped
from tests.engine.helpers import INTERPRETER, interpreted
from tests.engine.quant.test_awq import CUDA

E, H, WIDTH, K = 8, 64, 48, 2


def _case(T: int, seed: int = 0, dtype=torch.float32, skew: float = 0.0):
    """T tokens routed top-K of E; `skew`: the router favours experts 0 and 1 by that much
    (every token to both: each expert's slots span several blocks)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    gate_up = (torch.randn(E, 2 * WIDTH, H, generator=g) * 0.1).to(dtype)
    down = (torch.randn(E, H, WIDTH, generator=g) * 0.1).to(dtype)
    logits = torch.randn(T, E, generator=g)
    logits[:, :2] += skew
    ids, weights = grouped.route(logits, K, normalize=True)
    return x, gate_up, down, ids, weights


def _per_expert(x, gate_up, down, ids, weights):
    """Token by token, choice by choice: the MLP of each of its experts, weighted, summed."""
    out = torch.zeros_like(x, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = F.linear(x[t], gate_up[e]).chunk(2)
            out[t] += weights[t, j] * F.linear(F.silu(gate) * up, down[e]).float()
    return out.to(x.dtype)


class _Counting:
    """An expert-indexed weight that records which experts are read."""

    def __init__(self, weight: torch.Tensor):
        self.weight, self.read = weight, []

    def __getitem__(self, e):
        self.read.append(int(e))
        return self.weight[e]


def test_route_is_the_softmax_top_k_renormalised_or_not():
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.0]])
    ids, w = grouped.route(logits, 2, normalize=False)
    probs = torch.softmax(logits, -1)
    assert ids.tolist() == [[2, 3]] and torch.allclose(w, probs[:, [2, 3]])
    _, w = grouped.route(logits, 2, normalize=True)
    assert torch.allclose(w, torch.softmax(logits[:, [2, 3]], -1))  # Mixtral's: over the top-k


def test_the_product_equals_each_expert_applied_alone():
    for T, skew in ((1, 0.0), (5, 0.0), (37, 0.0), (37, 20.0)):  # skewed: several blocks
        x, gate_up, down, ids, weights = _case(T, seed=T, skew=skew)
        got = grouped.product(x, gate_up, down, ids, weights)
        want = _per_expert(x, gate_up, down, ids, weights)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (T, (got - want).abs().max())


def test_only_the_routed_experts_are_read():
    x, gate_up, down, ids, weights = _case(3, seed=1)
    routed = set(ids.flatten().tolist())
    assert len(routed) < E  # some experts are not routed to: the count can tell
    plan = grouped.plan(ids, E)
    assert plan.experts() == routed
    counted_gate_up, counted_down = _Counting(gate_up), _Counting(down)
    want = grouped.reference(x, gate_up, down, weights, plan)
    got = grouped.reference(x, counted_gate_up, counted_down, weights, plan)
    assert sorted(counted_gate_up.read) == sorted(routed) == sorted(counted_down.read)
    idle = torch.tensor(sorted(set(range(E)) - routed))
    gate_up[idle], down[idle] = float("nan"), float("nan")
    poisoned = grouped.product(x, gate_up, down, ids, weights)
    assert torch.equal(got, want) and torch.equal(poisoned, want)


INTERPRETED = """
import torch
from engine.kernels.experts import grouped
from tests.engine.kernels.test_expert_product import E, _case, _per_expert
for T, dtype, skew in ((19, torch.float32, 20.0), (6, torch.bfloat16, 0.0)):
    x, gate_up, down, ids, weights = _case(T, seed=T, dtype=dtype, skew=skew)
    assert skew == 0 or set(ids.flatten().tolist()) == {0, 1}  # 19 slots each: two blocks
    idle = torch.tensor(sorted(set(range(E)) - set(ids.flatten().tolist())))
    if len(idle):  # experts nobody routes to: NaN, which a read would spread
        gate_up[idle], down[idle] = float("nan"), float("nan")
    got = grouped.product(x, gate_up, down, ids, weights, kernel="triton")
    want = grouped.product(x, gate_up, down, ids, weights)
    assert got.dtype == dtype and bool(torch.isfinite(got).all()), T
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: the reference rounds gate and up
    rel = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert rel < tol, (T, dtype, rel)
print("ok")
"""


@INTERPRETER
def test_the_kernel_equals_the_reference_in_the_interpreter():
    interpreted(INTERPRETED)


@CUDA
def test_the_kernel_equals_the_reference_on_the_gpu():
    """bf16 at one Qwen3-30B-A3B layer's expert sizes (128 experts, top-8, 2048 -> 768),
    decode rows and a prefill chunk, the experts nobody routes to NaN."""
    g = torch.Generator().manual_seed(0)
    E, H, W, K = 128, 2048, 768, 8
    gate_up = (torch.randn(E, 2 * W, H, generator=g) * 0.02).to("cuda", torch.bfloat16)
    down = (torch.randn(E, H, W, generator=g) * 0.02).to("cuda", torch.bfloat16)
    for T in (1, 16, 300):
        x = torch.randn(T, H, generator=g).to("cuda", torch.bfloat16)
        ids, weights = grouped.route(torch.randn(T, E, generator=g).cuda(), K, normalize=True)
        idle = sorted(set(range(E)) - set(ids.flatten().tolist()))
        gu, dn = gate_up.clone(), down.clone()
        gu[idle], dn[idle] = float("nan"), float("nan")
        got = grouped.product(x, gu, dn, ids, weights, kernel="triton")
        want = grouped.product(x.float(), gate_up.float(), down.float(), ids, weights)
        ref16 = grouped.product(x, gate_up, down, ids, weights)  # bf16's own rounding
        assert bool(torch.isfinite(got).all())
        kernel, reference = (((a.float() - want).norm() / want.norm()).item()
                             for a in (got, ref16))
        assert 0 < reference and kernel <= 1.5 * reference, (T, kernel, reference)
