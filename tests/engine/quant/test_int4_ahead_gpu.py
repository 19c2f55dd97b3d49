"""A prefill's 4-bit products dequantized one ahead on a side stream (quant/int4_ahead.py), on a
GPU (the H200 runs these): AWQ and NF4 layers in a chain, one cut in two slices, give the
one-stream path's bits eagerly and replayed from a captured graph; out of order, they refuse."""

from __future__ import annotations

import pytest
import torch

from engine.quant import int4_ahead, int4_cuda
from engine.quant.int4_linear import Int4Linear, random_codes

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (the H200 runs it)")


def _awq(N: int, K: int, G: int, seed: int) -> Int4Linear:
    codes, zeros, scales = random_codes(N, K, G, torch.Generator().manual_seed(seed))
    return Int4Linear.from_codes(codes, zeros, scales, None, torch.bfloat16,
                                 torch.device("cuda"), kernel="mma")


def _nf4(N: int, K: int, seed: int):
    from engine.quant.nf4_linear import Nf4Linear

    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    absmax = torch.rand(N, K // 64, generator=g) + 0.1
    return Nf4Linear.from_codes_absmax(codes.cuda(), absmax.cuda(), None)


@pytest.fixture(scope="module")
def chain():
    big_rows = (int4_cuda.CHUNK_BYTES // 2 // 4096) * 3 // 2 // 16 * 16  # two slices
    layers = [_awq(512, 1024, 128, 1), _awq(4096, 512, 64, 2), _nf4(1024, 4096, 3),
              _awq(big_rows, 4096, 128, 4)]
    assert len(int4_cuda.slices(big_rows, 4096)) == 2
    return layers


def _run(layers, x, ahead):
    outs = []
    for lin in layers:  # each product's input: a slice of the one before, as wide as it takes
        h = x[:, :lin.in_features] if not outs else outs[-1][:, :lin.in_features]
        h = h if h.shape[1] == lin.in_features else torch.nn.functional.pad(
            h, (0, lin.in_features - h.shape[1]))
        outs.append(ahead.linear(h, lin) if ahead else lin(h))
    return outs


@pytest.mark.parametrize("rows", [65, 300])
def test_ahead_products_have_the_one_stream_bits(chain, rows):
    x = torch.randn(rows, 4096, generator=torch.Generator().manual_seed(rows)).cuda().bfloat16()
    assert all(int4_ahead.takes(lin, rows) for lin in chain)
    want = _run(chain, x, None)
    got = _run(chain, x, int4_ahead.DequantAhead(chain))
    torch.cuda.synchronize()
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_captured_ahead_products_replay_the_one_stream_bits(chain):
    x = torch.randn(200, 4096, generator=torch.Generator().manual_seed(5)).cuda().bfloat16()
    want = _run(chain, x, None)
    _run(chain, x, int4_ahead.DequantAhead(chain))  # warm
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        assert torch.cuda.is_current_stream_capturing()
        outs = _run(chain, x, int4_ahead.DequantAhead(chain))
    for o in outs:
        o.zero_()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(outs, want, strict=True):
        assert torch.equal(a, b)


def test_products_out_of_order_refuse(chain):
    ahead = int4_ahead.DequantAhead(chain[:2])
    x = torch.randn(100, 4096).cuda().bfloat16()
    with pytest.raises(RuntimeError, match="order"):
        ahead.linear(x[:, :4096], chain[1])


def test_plan_only_while_capturing(chain):
    assert int4_ahead.plan([], 300) is None  # not capturing: the one-stream path
    assert not int4_ahead.takes(chain[0], 64)  # the tensor-core kernel's rows
    assert not int4_ahead.takes(torch.nn.Linear(4, 4), 300)
