"""The rotation of keys and queries for a quantized KV cache (engine/cache/key_rotation.py): it
is orthonormal, leaves attention unchanged in exact arithmetic, and on keys with outlier
channels makes the int8 cache's attention closer to exact, through the engine's own
attention function (prefill chunks and one-token steps alike)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from engine.attention.prefill import StepContext, hearth_attention
from engine.cache import key_rotation
from engine.cache.kv_cache import KVCache

H, HKV, D, T = 6, 2, 64, 48


@pytest.mark.parametrize("dim", [64, 128, 80])
def test_rotation_is_orthonormal(dim):
    r = key_rotation.matrix(dim, "cpu")
    assert r.dtype == torch.float32 and r.shape == (dim, dim)
    torch.testing.assert_close(r @ r.T, torch.eye(dim), atol=1e-6, rtol=0)
    if dim in (64, 128):  # Hadamard: every entry +-1/sqrt(D)
        torch.testing.assert_close(r.abs(), torch.full((dim, dim), dim ** -0.5))
    torch.testing.assert_close(key_rotation.matrix(dim, "cpu"), r)  # the same every call


def test_rotated_attention_equals_plain_attention_in_fp32():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, n, T, D, generator=g, dtype=torch.float64) for n in (H, HKV, HKV))
    r = key_rotation.matrix(D, "cpu").double()
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    got = F.scaled_dot_product_attention(q @ r, k @ r, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    q32, k32, v32 = q.float(), k.float(), v.float()
    got32 = F.scaled_dot_product_attention(key_rotation.rotate(q32, r.float()),
                                           key_rotation.rotate(k32, r.float()), v32,
                                           is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got32, want.float(), atol=2e-6, rtol=2e-6)


def test_int8_and_fp8_caches_are_rotated():
    """Both quantized caches rotate their keys (fp8 rotated costs +0.12% perplexity on SmolLM2
    where its keys as they come cost +1.0%: BENCHMARKS.md); a 16-bit or fp32 one does not."""
    for kv in ("fp32", "bf16", "fp16"):
        assert KVCache(1, HKV, D, T, kv, "cpu").key_rotation is None
    for kv in ("int8", "fp8"):
        torch.testing.assert_close(KVCache(1, HKV, D, T, kv, "cpu").key_rotation,
                                   key_rotation.matrix(D, "cpu"))


@pytest.mark.parametrize("dim", [16, 64, 128])
def test_a_rotated_key_has_the_same_bits_in_any_pass(dim):
    """A key rotated alone, among 7 rows or among 300 comes out bit for bit the same: the
    Hadamard rotation is sums and differences per row, so a token's stored codes cannot depend
    on how many rows its pass held (a matrix product's fp32 rounding does)."""
    r = key_rotation.matrix(dim, "cpu")
    k = torch.randn(300, HKV, dim, generator=torch.Generator().manual_seed(5)) * 3
    whole = key_rotation.rotate(k, r, torch.float32)
    for lo, hi in ((0, 1), (17, 18), (40, 47), (299, 300)):
        assert torch.equal(key_rotation.rotate(k[lo:hi], r, torch.float32), whole[lo:hi])
    torch.testing.assert_close(whole, k @ r, atol=1e-5, rtol=1e-5)  # and it is x R


def outlier_qkv(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v with keys as real models have them: a few channels 20-40x the rest, the same
    channels in every token, and queries that read them (as RoPE's slow channels are read:
    the scores hang on the outlier channels)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, T + 1, D, generator=g) * 0.3
    k = torch.randn(1, HKV, T + 1, D, generator=g)
    v = torch.randn(1, HKV, T + 1, D, generator=g)
    outliers = torch.tensor([3, 17, 40])
    k[..., outliers] *= torch.tensor([20.0, -30.0, 40.0])
    q[..., outliers] *= 10.0
    return q, k, v


def engine_attention(kv_dtype: str, q, k, v, rotate: bool) -> torch.Tensor:
    """The engine's attention function over a one-layer cache: a prefill chunk of T tokens,
    then a one-token step -> both outputs [1, T + 1, H, D]."""
    cache = KVCache(1, HKV, D, T + 1, kv_dtype, "cpu")
    cache.key_rotation = key_rotation.matrix(D, "cpu") if rotate else None
    module = SimpleNamespace(layer_idx=0)
    out = []
    for lo, hi in ((0, T), (T, T + 1)):
        step = StepContext(cache, torch.arange(lo, hi), lo, hi)
        o, _ = hearth_attention(module, q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], None,
                                scaling=D ** -0.5, hearth_step=step)
        out.append(o)
    return torch.cat(out, dim=1)


def test_rotation_lowers_the_int8_caches_error_on_outlier_keys():
    """A scale per 32 elements of a key still spends each group's levels on its outlier (here
    every group holds one); rotated, the outliers spread over all 64 channels (1.24x less
    error here; with one scale a head it was 3.1x, the group scales having taken the rest).
    The real model's figures decide (docs/benchmark-log.md, "Scales per 32 elements")."""
    q, k, v = outlier_qkv(seed=7)
    exact = engine_attention("fp32", q, k, v, rotate=False)
    plain = (engine_attention("int8", q, k, v, rotate=False) - exact).abs().max()
    rotated = (engine_attention("int8", q, k, v, rotate=True) - exact).abs().max()
    assert rotated < plain / 1.2, (float(rotated), float(plain))


def test_rotation_is_exact_on_a_fp32_reference_of_the_same_keys():
    """The rotated path over an int8 cache reads back the same attention as an unrotated int8
    cache would over rotated inputs: prefill and one-token steps both rotate q and k."""
    q, k, v = outlier_qkv(seed=3)
    r = key_rotation.matrix(D, "cpu")
    got = engine_attention("int8", q, k, v, rotate=True)
    want = engine_attention("int8", q @ r, k @ r, v, rotate=False)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
