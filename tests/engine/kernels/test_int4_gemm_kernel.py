"""The Triton GEMM over tinygemm's int4 layout (kernels/int4_gemm_kernel.py): the
column permutation is the packed nibbles' own order (CPU, exact, every tile count), the kernel
equals the dequantized reference under Triton's interpreter (odd row and column counts, groups
of 32, 64 and 128, 2, 4 and 8 inner k-tiles), and on a GPU at the benchmark shapes, against
torch's own packing, where Int4Linear takes it for a prefill chunk."""

from __future__ import annotations

import pytest
import torch

from engine.quant import tinygemm_layout
from tests.engine.helpers import INTERPRETER, interpreted
from tests.engine.quant.test_awq import CUDA, random_layer, rel


@pytest.mark.parametrize("tiles", [2, 4, 8])
def test_the_permutation_is_the_order_of_the_packed_nibbles(tiles):
    N, K = 24, 16 * tiles * 3
    codes = torch.randint(0, 16, (N, K), generator=torch.Generator().manual_seed(tiles),
                          dtype=torch.uint8)
    packed = tinygemm_layout.pack(codes, tiles)  # [N/8, KO, 32, T/2]
    J, KO = tiles // 2, K // (16 * tiles)
    # row n = 8 nt + a of tile ko: lanes 4a..4a+3, each J words, 8 nibbles a word, low first
    words = packed.view(N // 8, KO, 8, 4 * J).permute(0, 2, 1, 3).reshape(N, KO, 4 * J)
    nibbles = (words[..., None] >> (4 * torch.arange(8, dtype=torch.int32))) & 0xF
    in_memory_order = nibbles.reshape(N, K).to(torch.uint8)
    assert torch.equal(in_memory_order, tinygemm_layout.to_nibble_order(codes, tiles))
    assert torch.equal(tinygemm_layout.unpack(packed), codes)  # and the layout round-trips


INTERPRETED = """
import torch
from engine.quant import tinygemm_layout
from engine.quant.int4_linear import Int4Linear, fused_matmul
from tests.engine.quant.test_awq import random_layer, rel
small = dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2)
for M, N, K, G, T, dtype, cfg in ((3, 64, 256, 128, 8, torch.float16, None),
                                  (17, 96, 256, 64, 4, torch.bfloat16, None),
                                  (40, 200, 128, 32, 2, torch.float16, small),
                                  (130, 64, 512, 128, 8, torch.bfloat16, None)):
    codes, zeros, scales = random_layer(N, K, G=G, seed=M)
    ref = Int4Linear.from_codes(codes, zeros, scales, None, dtype, torch.device("cpu"),
                                kernel="reference")
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(3)).to(dtype)
    out = fused_matmul(x, tinygemm_layout.pack(codes, T), ref.scales_zeros, G, cfg)
    assert out.shape == (M, N) and out.dtype == dtype
    assert rel(out, ref(x)) < 1e-2, (M, N, K, G, T, rel(out, ref(x)))  # 16-bit output rounding
print("ok")
"""


@INTERPRETER
def test_the_gemm_equals_the_reference_in_the_interpreter():
    interpreted(INTERPRETED)


@CUDA
@pytest.mark.parametrize("G", [32, 64, 128])
@pytest.mark.parametrize("rows", [1, 5, 16, 65, 512])
@pytest.mark.parametrize("N, K", [(4608, 3584), (3584, 18944), (37888, 3584), (3584, 3584)])
def test_gpu_gemm_equals_the_reference(G, rows, N, K):
    from engine.quant import awq_format
    from engine.quant.int4_linear import Int4Linear, fused_matmul, tinygemm_gemm_ok

    dev = torch.device("cuda")
    assert tinygemm_gemm_ok("cuda")  # the load-time check passes on a working GPU
    codes, zeros, scales = random_layer(N, K, G=G, seed=rows)
    lin = Int4Linear.from_codes(codes, zeros, scales, None, torch.bfloat16, dev, "tinygemm")
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(4)).to(dev, torch.bfloat16)
    exact = x.float() @ awq_format.dequantize(codes, zeros, scales).to(dev).t()
    assert rel(fused_matmul(x, lin.packed, lin.scales_zeros, G), exact) < 1e-2
    if rows > 64:  # what Int4Linear runs for a prefill chunk
        assert lin._fused_gemm(rows) and rel(lin(x), exact) < 1e-2


@CUDA
def test_gpu_gemm_reads_a_fused_members_view():
    """q/k/v fused: each member's packed tensor is a row view of the fused one."""
    from engine.quant.int4_linear import Int4Linear

    dev = torch.device("cuda")
    mods = [Int4Linear.from_codes(*random_layer(n, 1024, seed=n), None, torch.bfloat16, dev,
                                  "tinygemm") for n in (512, 128, 128)]
    x = torch.randn(100, 1024, device=dev, dtype=torch.bfloat16)
    alone = [m(x) for m in mods]
    fused = Int4Linear.concat(mods)
    assert rel(fused(x), torch.cat(alone, dim=1)) < 1e-2
    for m, a in zip(mods, alone, strict=True):
        assert rel(m(x), a) < 1e-3
