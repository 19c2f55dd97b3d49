"""The grouped expert product over 4-bit experts (kernels/experts/packed.py, quant/experts4.py):
the rounding holds each weight within half a step of its code, the product equals the 16-bit
product of the dequantized weights, it reads only the routed experts (indices counted, the
other experts' scales NaN), and the Triton kernel, dequantizing in registers, equals the
reference and the 16-bit kernel over the dequantized weights under Triton's interpreter, AWQ's
codes and NF4's table."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.experts import grouped
from engine.kernels.experts.packed import code_values
from engine.quant import awq_format, experts4
from tests.engine.helpers import INTERPRETER, interpreted
from tests.engine.kernels.test_expert_product import _Counting, _per_expert
from tests.engine.quant.test_awq import CUDA

E, H, WIDTH, K = 8, 128, 64, 2  # gate_up: groups of 128 (AWQ), down: of 64


def _case(T: int, quant: str, seed: int = 0, dtype=torch.float32, skew: float = 0.0):
    """T tokens routed top-K of E, the experts rounded to `quant` -> (x, gate_up, down, ids,
    weights, the 16-bit weights they came from)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    w_gate_up = torch.randn(E, 2 * WIDTH, H, generator=g) * 0.1
    w_down = torch.randn(E, H, WIDTH, generator=g) * 0.1
    logits = torch.randn(T, E, generator=g)
    logits[:, :2] += skew
    ids, weights = grouped.route(logits, K, normalize=True)
    gate_up, down = (experts4.quantize(w, quant, dtype, torch.device("cpu"))
                     for w in (w_gate_up, w_down))
    return x, gate_up, down, ids, weights, (w_gate_up, w_down)


def _dense(p) -> torch.Tensor:
    """A Packed4's every expert dequantized: [E, N, K]."""
    return torch.stack([p[e] for e in range(p.shape[0])])


@pytest.mark.parametrize("quant", experts4.FORMATS)
def test_each_weight_is_within_half_a_step_of_its_rounding(quant):
    _, gate_up, down, _, _, (w_gate_up, w_down) = _case(1, quant)
    assert gate_up.shape == tuple(w_gate_up.shape) and down.shape == tuple(w_down.shape)
    assert gate_up.group_size == (128 if quant == "awq" else 64) and down.group_size == 64
    for p, w in ((gate_up, w_gate_up), (down, w_down)):
        G = p.group_size
        err = (_dense(p) - w).abs().view(E, p.shape[1], -1, G)  # [E, N, K/G, G]
        if quant == "awq":  # a step is the group's scale
            step = p.scales.transpose(1, 2)[..., None]
        else:  # NF4: the widest gap between neighbouring codes, times the block's absmax
            step = code_values(True, "cpu").diff().max() * p.scales.transpose(1, 2)[..., None]
        assert bool((err <= step / 2 + 1e-6).all()), (err - step / 2).max()
    codes, zeros, scales = awq_format.quantize(w_down[3], 64)
    if quant == "awq":  # the same codes as a dense AWQ linear's
        assert torch.allclose(down[3], awq_format.dequantize(codes, zeros, scales), atol=1e-6)


@pytest.mark.parametrize("quant", experts4.FORMATS)
def test_the_product_equals_the_16_bit_product_of_the_dequantized_weights(quant):
    for T, skew in ((1, 0.0), (37, 20.0)):  # skewed: an expert's slots over several blocks
        x, gate_up, down, ids, weights, _ = _case(T, quant, seed=T, skew=skew)
        got = grouped.product(x, gate_up, down, ids, weights)
        want = _per_expert(x, _dense(gate_up), _dense(down), ids, weights)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (T, (got - want).abs().max())


@pytest.mark.parametrize("quant", experts4.FORMATS)
def test_only_the_routed_experts_are_read(quant):
    x, gate_up, down, ids, weights, _ = _case(3, quant, seed=1)
    routed = set(ids.flatten().tolist())
    assert len(routed) < E  # some experts are not routed to: the count can tell
    plan = grouped.plan(ids, E)
    want = grouped.reference(x, gate_up, down, weights, plan)
    counted_gate_up, counted_down = _Counting(gate_up), _Counting(down)
    got = grouped.reference(x, counted_gate_up, counted_down, weights, plan)
    assert sorted(counted_gate_up.read) == sorted(routed) == sorted(counted_down.read)
    idle = torch.tensor(sorted(set(range(E)) - routed))
    gate_up.scales[idle], down.scales[idle] = float("nan"), float("nan")
    poisoned = grouped.product(x, gate_up, down, ids, weights)
    assert torch.equal(got, want) and torch.equal(poisoned, want)


INTERPRETED = """
import torch
from engine.kernels.experts import grouped
from tests.engine.kernels.test_expert_product4 import E, _case, _dense
for quant, T, dtype, skew in (("awq", 19, torch.float32, 20.0), ("nf4", 6, torch.bfloat16, 0.0)):
    x, gate_up, down, ids, weights, _ = _case(T, quant, seed=T, dtype=dtype, skew=skew)
    assert skew == 0 or set(ids.flatten().tolist()) == {0, 1}  # 19 slots each: two blocks
    idle = torch.tensor(sorted(set(range(E)) - set(ids.flatten().tolist())))
    for p in (gate_up, down):  # experts nobody routes to: NaN, which a read would spread
        p.scales[idle] = float("nan")
        if p.offsets is not None:
            p.offsets[idle] = float("nan")
    got = grouped.product(x, gate_up, down, ids, weights, kernel="triton")
    want = grouped.product(x, gate_up, down, ids, weights)
    # the 16-bit kernel over the dequantized weights (NaN where nobody routes)
    dense = grouped.product(x, _dense(gate_up), _dense(down), ids, weights, kernel="triton")
    assert got.dtype == dtype and bool(torch.isfinite(got).all()), (quant, T)
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: the reference rounds gate, up
    for other in (want, dense):
        rel = ((got.float() - other.float()).norm() / other.float().norm()).item()
        assert rel < tol, (quant, T, dtype, rel)
print("ok")
"""


@INTERPRETER
def test_the_kernel_equals_the_reference_in_the_interpreter():
    interpreted(INTERPRETED)


@CUDA
@pytest.mark.parametrize("quant", experts4.FORMATS)
def test_the_kernel_equals_the_reference_on_the_gpu(quant):
    """At one Qwen3-30B-A3B layer's expert sizes (128 experts, top-8, 2048 -> 768), bf16
    activations, decode rows and a prefill chunk, against the fp32 product of the dequantized
    weights, no farther than the bf16 reference is."""
    g = torch.Generator().manual_seed(0)
    E, H, W, K = 128, 2048, 768, 8
    gate_up, down = (experts4.quantize(torch.randn(*shape, generator=g) * 0.02, quant,
                                       torch.bfloat16, torch.device("cuda"))
                     for shape in ((E, 2 * W, H), (E, H, W)))
    exact = [torch.stack([p[e].float() for e in range(E)]) for p in (gate_up, down)]
    for T in (1, 16, 300):
        x = torch.randn(T, H, generator=g).to("cuda", torch.bfloat16)
        ids, weights = grouped.route(torch.randn(T, E, generator=g).cuda(), K, normalize=True)
        got = grouped.product(x, gate_up, down, ids, weights, kernel="triton")
        want = grouped.product(x.float(), *exact, ids, weights)
        ref16 = grouped.product(x, gate_up, down, ids, weights)
        assert bool(torch.isfinite(got).all())
        kernel, reference = (((a.float() - want).norm() / want.norm()).item()
                             for a in (got, ref16))
        assert 0 < reference and kernel <= 1.5 * reference, (T, kernel, reference)
