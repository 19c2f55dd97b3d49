"""The "mma" int4 kernels: kernels/int4_gemv_kernel.py for a decode step's 1 to 4
rows, kernels/int4_mma_kernel.py on the tensor cores up to 64, the dense path past that
(quant/int4_cuda.py), their layout (quant/int4_tile_layout.py). On a GPU: every product against
the dequantized reference at the benchmark shapes (Qwen2.5-7B's and Llama-3.1-8B's layers and
int4 lm_heads) and groups of 32, 64 and 128 (and the gemv at every launch shape it may take);
the dequantizing kernel equal to Int4Linear.dequantize() bit for bit; a row's output the same
bits alone or among the others of its kernel's range (no atomics, a fixed order); graph replays
equal to eager calls; a fused layer's members (views of its scales) through the kernels; a
gate/up's SiLU * up in the gemv's launch with the bits of the product, then the piece. On the
CPU the layouts round-trip, a word holds the tensor cores' fragment, and the gemv's launch
constants come from the shape alone."""

from __future__ import annotations

import pytest
import torch

from engine.quant import int4_tile_layout
from engine.quant.int4_linear import Int4Linear, pack_rows, unpack_rows
from tests.engine.helpers import captured
from tests.engine.quant.test_awq import CUDA, random_layer, rel

SHAPES = [(4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944),  # Qwen2.5-7B's q/k/v, o,
          (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),  # gate/up, down; Llama-3.1-
          (152064, 3584), (128256, 4096),  # 8B's; both int4 lm_heads (the benchmark shapes)
          (208, 512), (80, 576)]


def test_the_row_layout_round_trips():
    codes = torch.randint(0, 16, (24, 160), generator=torch.Generator().manual_seed(1),
                          dtype=torch.uint8)
    assert torch.equal(unpack_rows(pack_rows(codes)), codes)


def test_the_tile_layout_round_trips_and_puts_each_fragment_in_its_nibbles():
    N, K = 48, 192
    codes = torch.randint(0, 16, (N, K), generator=torch.Generator().manual_seed(2),
                          dtype=torch.uint8)
    packed = int4_tile_layout.pack(codes)
    assert packed.shape == (N // 16, K // 64, 32, 4) and packed.dtype == torch.int32
    assert torch.equal(int4_tile_layout.unpack(packed), codes)
    T, j, lane, c = 2, 1, 13, 3  # one word, read as the mma's A fragment (g = 3, t = 1)
    g, t = lane // 4, lane % 4
    k0 = 64 * j + 32 * (c // 2) + 8 * t + 4 * (c % 2)  # the product's k-tile c, this lane
    word = int(packed[T, j, lane, c]) & 0xFFFFFFFF
    rows = [16 * T + g, 16 * T + g + 8, 16 * T + g, 16 * T + g + 8]
    ks = [k0, k0, k0 + 2, k0 + 2]
    for i in range(4):  # register a_i: nibbles i (low half) and i + 4 (high half)
        assert (word >> 4 * i) & 0xF == codes[rows[i], ks[i]]
        assert (word >> 4 * (i + 4)) & 0xF == codes[rows[i], ks[i] + 1]


def test_the_codebook_order_puts_a_registers_pair_in_adjacent_nibbles():
    codes = torch.randint(0, 16, (32, 128), generator=torch.Generator().manual_seed(4),
                          dtype=torch.uint8)
    plain, nf4 = int4_tile_layout.pack(codes), int4_tile_layout.pack(codes, codebook=True)
    assert torch.equal(int4_tile_layout.unpack(nf4, codebook=True), codes)
    a, b = plain.to(torch.int64) & 0xFFFFFFFF, nf4.to(torch.int64) & 0xFFFFFFFF
    for i in range(4):  # register i: nibbles i and i + 4 in the plain order, 2i and 2i + 1 here
        assert torch.equal((a >> 4 * i) & 0xF, (b >> 8 * i) & 0xF)
        assert torch.equal((a >> 4 * (i + 4)) & 0xF, (b >> (8 * i + 4)) & 0xF)


def test_the_tile_layout_packs_a_slice_of_row_tiles_at_a_time_with_the_same_words(monkeypatch):
    codes = torch.randint(0, 16, (208, 256), generator=torch.Generator().manual_seed(3),
                          dtype=torch.uint8)
    whole = int4_tile_layout.pack(codes)
    monkeypatch.setattr(int4_tile_layout, "PACK_BYTES", 8 * 256 * 48)  # 48 rows a slice
    assert torch.equal(int4_tile_layout.pack(codes), whole)
    assert torch.equal(int4_tile_layout.unpack(whole), codes)


def cuda_layer(N, K, G, seed=0):
    codes, zeros, scales = random_layer(N, K, G=G, seed=seed)
    return Int4Linear.from_codes(codes, zeros, scales, None, torch.bfloat16,
                                 torch.device("cuda"), kernel="mma")


@CUDA
@pytest.mark.parametrize("N, K", SHAPES)
@pytest.mark.parametrize("G", [32, 64, 128])
def test_the_products_equal_the_dequantized_reference(N, K, G):
    if K % G:
        pytest.skip("the group does not divide K")
    from engine.kernels.int4_dequant_kernel import dequant

    lin = cuda_layer(N, K, G)
    w = lin.dequantize()
    buf = torch.full((N * K,), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert torch.equal(dequant(lin.packed, lin.scales_zeros, G, 0, N, buf), w)
    assert torch.equal(dequant(lin.packed, lin.scales_zeros, G, 16, N - 32, buf),
                       w[16:N - 16])
    g = torch.Generator().manual_seed(K + G)
    for rows in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64, 65, 512):
        x = torch.randn(rows, K, generator=g).to("cuda", torch.bfloat16)
        out = lin(x)
        ref = x.float() @ w.float().t()
        assert out.shape == (rows, N) and not out.isnan().any()
        assert rel(out, ref) < 1e-2, (rows, rel(out, ref))  # bf16 output rounding ~3e-3


@CUDA
@pytest.mark.parametrize("N, K", [(4608, 3584), (3584, 18944), (37888, 3584)])  # 8, 16, 4 warps
def test_a_row_has_the_same_bits_alone_or_among_others(N, K):
    """Within each kernel's range of rows: the gemv's 1-4, int4_mma's 5-64."""
    from engine.kernels.int4_gemv_kernel import GEMV_MAX_ROWS

    most = 64
    lin = cuda_layer(N, K, 128, seed=3)
    x = torch.randn(most, K, generator=torch.Generator().manual_seed(4)).to(
        "cuda", torch.bfloat16)
    few = lin(x[:GEMV_MAX_ROWS])
    for i in range(GEMV_MAX_ROWS):
        assert torch.equal(lin(x[i:i + 1]), few[i:i + 1])
    assert torch.equal(lin(x[1:3]), few[1:3])
    together = lin(x)
    first = GEMV_MAX_ROWS + 1
    for i in (0, 1, most - first):
        assert torch.equal(lin(x[i:i + first]), together[i:i + first])
    assert torch.equal(lin(x[: most // 2 + 1]), together[: most // 2 + 1])


def test_the_gemv_launch_comes_from_the_shape_alone():
    from engine.kernels.int4_gemv_kernel import variant

    for N, K, warps in [(4608, 3584, 8), (3584, 3584, 16), (37888, 3584, 4),
                        (3584, 18944, 16), (152064, 3584, 4), (208, 512, 16)]:
        v = variant(128, N, K)
        assert v["S"] * v["SPLITS"] == warps and v["S"] <= 8, (N, K, v)
        assert variant(32, N, K) == dict(v, G=32)  # the group changes the arithmetic only


@CUDA
@pytest.mark.parametrize("G", [32, 128])
@pytest.mark.parametrize("S, SPLITS", [(4, 1), (8, 1), (8, 2), (4, 4)])
@pytest.mark.parametrize("XPRE", [0, 1])
def test_every_gemv_launch_gives_the_reference_product(G, S, SPLITS, XPRE):
    from engine.kernels import int4_gemv_kernel

    N, K = 208, 1152  # 18 k-groups: splits and warps with uneven shares, some with none
    lin = cuda_layer(N, K, G, seed=G + S)
    w = lin.dequantize().float()
    launch = dict(S=S, SPLITS=SPLITS, G=G, XPRE=XPRE, LUT=0)
    x = torch.randn(8, K, generator=torch.Generator().manual_seed(9)).to("cuda", torch.bfloat16)
    for rows in (1, 2, 5, 8):
        out = int4_gemv_kernel.matmul(x[:rows], lin.packed, lin.scales_zeros, G, launch)
        assert rel(out, x[:rows].float() @ w.t()) < 1e-2, rows


@CUDA
@pytest.mark.parametrize("rows", [1, 4, 16, 64, 100])
def test_graph_replays_equal_eager_calls(rows):
    lin = cuda_layer(3584, 3584, 128, seed=5)
    x = torch.randn(rows, 3584, generator=torch.Generator().manual_seed(6)).to(
        "cuda", torch.bfloat16)
    eager = lin(x)
    graph, out = captured(lambda: lin(x))
    x.copy_(x.flip(0))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, lin(x))
    x.copy_(x.flip(0))
    graph.replay()
    assert torch.equal(out, eager)


def test_a_cpu_layer_never_takes_the_glu_launch():
    codes, zeros, scales = random_layer(64, 128, G=64)
    lin = Int4Linear.from_codes(codes, zeros, scales, None, torch.float32, torch.device("cpu"),
                                kernel="reference")
    lin.choose_glu()
    assert not lin.glu and lin.silu_glu(torch.randn(1, 128)) is None


@CUDA
def test_a_fused_layers_members_run_on_views_of_its_scales():
    from engine.quant import int4_cuda

    mods = [cuda_layer(n, 1024, 64, seed=n) for n in (512, 128, 128)]
    x = torch.randn(2, 1024, generator=torch.Generator().manual_seed(7)).to("cuda",
                                                                             torch.bfloat16)
    alone = [m(x) for m in mods]
    fused = Int4Linear.concat(mods)
    assert torch.equal(fused(x), torch.cat(alone, dim=1))
    assert not fused.glu  # only a gate/up is asked (step_weights), after its concat
    pair = Int4Linear.concat([cuda_layer(512, 1024, 64, seed=9), cuda_layer(512, 1024, 64)])
    pair.choose_glu()  # timed; the bits are the same either way
    assert pair.glu == int4_cuda.glu_faster(1024, 1024, 64, False, "cuda:0")
    out = pair.silu_glu(x)
    assert (out is None) != pair.glu and (out is None or out.shape == (2, 512))
    for m, a in zip(mods, alone, strict=True):
        assert not m.scales_zeros.is_contiguous()
        assert torch.equal(m(x), a)


@CUDA
@pytest.mark.parametrize("N, K", [(37888, 3584), (28672, 4096), (192, 512)])
@pytest.mark.parametrize("G", [32, 64, 128])
def test_the_gemvs_silu_times_up_has_the_bits_of_the_product_then_the_piece(N, K, G):
    """A fused [gate; up] layer's SiLU(gate) * up in the gemv's own launch (a decode step's MLP
    input) against the plain launch followed by the Triton piece, eagerly and replayed."""
    from engine.kernels.fused_ops_kernel import silu_mul
    from engine.kernels.int4_gemv_kernel import GEMV_MAX_ROWS
    from engine.quant import int4_cuda

    assert int4_cuda.glu_ok("cuda:0")
    lin = cuda_layer(N, K, G, seed=N + G)
    lin.glu = True  # as choose_glu sets it where the launch measured faster
    x = torch.randn(GEMV_MAX_ROWS + 1, K, generator=torch.Generator().manual_seed(G)).to(
        "cuda", torch.bfloat16) * 4  # gate values past SiLU's bend
    for rows in range(1, GEMV_MAX_ROWS + 1):
        fused = lin.silu_glu(x[:rows])
        assert fused.shape == (rows, N // 2)
        assert torch.equal(fused, silu_mul(lin(x[:rows]))), rows
    assert lin.silu_glu(x) is None  # past the gemv's rows: the product, then the piece
    eager = lin.silu_glu(x[:1])
    graph, out = captured(lambda: lin.silu_glu(x[:1]))
    graph.replay()
    assert torch.equal(out, eager)
