"""Programmatic dependent launch (platform/nvrtc.py, HEARTH_PDL): on Hopper the int4 decode
products start while the kernel before them finishes and prefetch their first weights, and the
Triton pieces let them (kernels/fused_ops_kernel.py pdl_options). A product must still read
its input only after that kernel is done, so a decode layer's chain of launches (norm, q/k/v,
attention, o, norm, SiLU(gate) * up, down) gives the bits of plain launches, eagerly and in
every replay of its CUDA graph while its input changes between replays (a read too early would
see the previous replay's values). AWQ and NF4 (whose gemv loads x with the weights)."""

from __future__ import annotations

import pytest
import torch

from engine.quant.nf4_linear import Nf4Linear
from tests.engine.helpers import captured
from tests.engine.kernels.test_int4_mma_kernel import cuda_layer
from tests.engine.quant.test_awq import CUDA

HOPPER = pytest.mark.skipif(not torch.cuda.is_available()
                            or torch.cuda.get_device_capability()[0] < 9,
                            reason="needs a GPU with programmatic dependent launch (sm_90 on)")
HIDDEN, INNER, HEADS, KV_HEADS, D = 3584, 18944, 28, 4, 128  # Qwen2.5-7B's layer


def _fresh(monkeypatch, mode: str) -> None:
    """The pdl setting `mode`, and the launches looked up again (the gemv keeps its kernels by
    shape)."""
    from engine.kernels import int4_gemv_kernel
    from engine.platform import nvrtc

    monkeypatch.setattr(nvrtc, "_pdl", mode)
    int4_gemv_kernel._plan.cache_clear()
    int4_gemv_kernel._product.cache_clear()


def _nf4(N, K, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (N, K), generator=g).to("cuda")
    absmax = (torch.rand(N, K // 64, generator=g) + 0.1).to("cuda")
    return Nf4Linear.from_codes_absmax(codes, absmax, None)


def _layer(nf4: bool):
    make = _nf4 if nf4 else (lambda N, K, seed: cuda_layer(N, K, 128, seed=seed))
    qkv = make((HEADS + 2 * KV_HEADS) * D, HIDDEN, 1)
    o = make(HIDDEN, HIDDEN, 2)
    gate_up = make(2 * INNER, HIDDEN, 3)
    gate_up.glu = True  # SiLU * up in the product's launch (checked at load: int4_cuda.glu_ok)
    down = make(HIDDEN, INNER, 4)
    return qkv, o, gate_up, down


def _chain(layer, x, w):
    """A decode layer's launches on one row: the attention's two Triton programs over a cache
    of 1,024 keys, the norms as Triton pieces, the products as gemvs."""
    from engine.kernels import decode_attention_kernel as attn
    from engine.kernels import fused_ops_kernel as K

    qkv, o, gate_up, down = layer
    h = K.rms(x, w, 1e-6)
    q = qkv(h)[:, :HEADS * D].view(1, HEADS, 1, D)
    a = attn.decode_attention(q, _CACHE["kv"], _CACHE["pos"], 1024, D ** -0.5, None)
    s, h = K.add_rms(x, o(a.reshape(1, HEADS * D)), w, 1e-6)
    return s + down(gate_up.silu_glu(h))


_CACHE: dict = {}


def _kv():
    from engine.cache.kv_cache import LayerKV

    g = torch.Generator().manual_seed(9)
    k, v = (torch.randn(8, KV_HEADS, 128, D, generator=g).to("cuda", torch.bfloat16)
            for _ in range(2))
    table = torch.arange(8, dtype=torch.int32, device="cuda")
    _CACHE.update(kv=LayerKV(k, v, None, None, table), pos=torch.tensor([900], device="cuda"))


@CUDA
@HOPPER
@pytest.mark.parametrize("nf4", [False, True])
def test_a_layer_launched_as_dependents_has_the_bits_of_plain_launches(monkeypatch, nf4):
    from engine.kernels import fused_ops_kernel, int4_gemv_kernel

    _kv()
    layer = _layer(nf4)
    w = (torch.rand(HIDDEN, generator=torch.Generator().manual_seed(5)) + 0.5).to(
        "cuda", torch.bfloat16)
    inputs = [torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(10 + i)).to(
        "cuda", torch.bfloat16) for i in range(12)]

    _fresh(monkeypatch, "off")
    assert fused_ops_kernel.pdl_options(torch.device("cuda"), 1) == dict(PDL=False)
    plain = [_chain(layer, x, w) for x in inputs]

    for mode in ("products", "auto"):
        _fresh(monkeypatch, mode)
        x = inputs[0].clone()
        assert torch.equal(_chain(layer, x, w), plain[0]), mode
        v, product = int4_gemv_kernel._plan(128 if not nf4 else 64, HIDDEN, HIDDEN, nf4, 0)
        assert product.pdl  # the products did launch as dependents
        assert fused_ops_kernel.pdl_options(torch.device("cuda"), 1)["PDL"]
        graph, out = captured(lambda: _chain(layer, x, w))  # noqa: B023 - replayed here
        for i in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 3):
            x.copy_(inputs[i])
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, plain[i]), (mode, i)
        for i in range(len(inputs)):  # back to back, no synchronizing between the replays
            x.copy_(inputs[i])
            graph.replay()
            plain_out = out.clone()
            assert torch.equal(plain_out, plain[i]), (mode, "back to back", i)
