"""The grouped expert product (kernels/experts): against a per-expert, per-token reference on
the CPU; it reads only the experts the step routes to (the indices it takes from the weights,
counted, are the routed set, each once; the other experts' weights are NaN and nothing turns
NaN); the Triton kernel equals the reference under Triton's interpreter, NaN experts included."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels.experts import grouped
from tests.engine.helpers import INTERPRETER, interpreted

E, H, WIDTH, K = 8, 64, 48, 2


def _case(T: int, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    gate_up = (torch.randn(E, 2 * WIDTH, H, generator=g) * 0.1).to(dtype)
    down = (torch.randn(E, H, WIDTH, generator=g) * 0.1).to(dtype)
    ids, weights = grouped.route(torch.randn(T, E, generator=g), K, normalize=True)
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
    for T in (1, 5, 37):  # 37 tokens: an expert's slots span several blocks
        x, gate_up, down, ids, weights = _case(T, seed=T)
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
for T, dtype in ((1, torch.float32), (19, torch.float32), (6, torch.bfloat16)):
    x, gate_up, down, ids, weights = _case(T, seed=T, dtype=dtype)
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
