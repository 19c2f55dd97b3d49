"""tinygemm's CUDA int4 layout (engine/quant/tinygemm_layout.py): unpacking inverts packing, the
dequantized weight is the AWQ reference's, and on a GPU `unpack` reads torch's own packing and
Int4Linear's prefill path (unpack, then a bf16 matmul) equals the reference."""

from __future__ import annotations

import pytest
import torch

from engine.quant import awq_format, tinygemm_layout
from engine.quant.int4_linear import TINYGEMM_MAX_ROWS, Int4Linear, kernel_fits, tinygemm_unpack_ok
from tests.engine.quant.test_awq import random_layer, rel


@pytest.mark.parametrize("tiles", [2, 4, 8])
@pytest.mark.parametrize("N, K", [(16, 256), (40, 512)])
def test_unpack_inverts_pack(tiles, N, K):
    codes = random_layer(N, K, seed=tiles)[0]
    packed = tinygemm_layout.pack(codes, tiles)
    assert packed.shape == (N // 8, K // (16 * tiles), 32, tiles // 2)
    assert packed.dtype == torch.int32
    assert torch.equal(tinygemm_layout.unpack(packed), codes)
    assert torch.equal(tinygemm_layout.unpack(packed, slice(1, 2)), codes[8:16])


def test_the_layout_places_each_code_where_the_packing_kernel_does():
    """One code alone, at n = 8 nt + a, k = 16 T ko + 32 j + 8 i + 2 b + h: it lands in word
    [nt, ko, 4 a + b, j] at nibble 4 h + i."""
    T, N, K = 4, 16, 128
    for n, k in ((0, 0), (9, 1), (3, 70), (15, 127)):
        codes = torch.zeros(N, K, dtype=torch.uint8)
        codes[n, k] = 5
        words = tinygemm_layout.pack(codes, T)
        nt, a = divmod(n, 8)
        ko, r = divmod(k, 16 * T)
        j, r = divmod(r, 32)
        i, r = divmod(r, 8)
        b, h = divmod(r, 2)
        expect = torch.zeros_like(words)
        expect[nt, ko, 4 * a + b, j] = 5 << (4 * (4 * h + i))
        assert torch.equal(words, expect), (n, k)


@pytest.mark.parametrize("chunk", [1 << 21, 8 * 256])  # one chunk; a row tile a chunk
def test_dequantize_is_the_awq_reference(chunk, monkeypatch):
    monkeypatch.setattr(tinygemm_layout, "CHUNK_CODES", chunk)
    codes, zeros, scales = random_layer(24, 256, G=64, seed=3)
    s = scales.float()
    sz = torch.stack((s, (8 - zeros.float()) * s), dim=-1)  # [K/G, N, 2], Int4Linear's form
    packed = tinygemm_layout.pack(codes, 8)
    w = tinygemm_layout.dequantize(packed, sz, 64)
    assert torch.allclose(w, awq_format.dequantize(codes, zeros, scales), atol=1e-6)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@CUDA
def test_unpack_reads_torchs_packing_and_prefill_rows_equal_the_reference():
    dev = torch.device("cuda")
    if not kernel_fits("tinygemm", dev, torch.bfloat16, 4608, 3584, 128):
        pytest.skip("tinygemm does not run here")
    assert tinygemm_unpack_ok(str(dev))
    codes, zeros, scales = random_layer(4608, 3584, seed=9)
    lin = Int4Linear.from_codes(codes, zeros, scales, None, torch.bfloat16, dev, "tinygemm")
    assert torch.equal(tinygemm_layout.unpack(lin.packed).cpu(), codes)
    exact = awq_format.dequantize(codes, zeros, scales).to(dev)
    assert rel(lin.dequantize(), exact) < 1e-2  # bf16
    x = torch.randn(TINYGEMM_MAX_ROWS + 200, 3584, device=dev, dtype=torch.bfloat16)
    # past tinygemm's rows: the Triton GEMM over its layout (the default) or the unpacked
    # dense product, never tinygemm's own kernel; one row: tinygemm
    rows = x.shape[0]
    assert (lin._dense(rows) or lin._fused_gemm(rows)) and not lin._dense(1)
    assert not lin._fused_gemm(1)
    assert rel(lin(x), x.float() @ exact.t()) < 1e-2


def test_without_tinygemms_packing_the_unpacked_path_is_not_taken():
    """The guard runs torch's packing and compares: where there is none (CPU torch), no."""
    assert tinygemm_unpack_ok("cpu") is False
