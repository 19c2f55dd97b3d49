"""The engine's NF4 layer (quant/nf4_linear.py): bitsandbytes' codes and absmax read
back exactly into the "mma" layout, the product of the codebook kernels (the decode gemv, the
dequantizing kernel and cuBLAS) against the layer's dequantized reference, and a model loaded
NF4 on a GPU running the engine's layers with bitsandbytes' logits. On the CPU: the code is
bitsandbytes', a quantized layer's codes come back, what does not fit stays bitsandbytes'."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine.kernels.int4_dequant_kernel import NF4_CODES, codebook_source, nf4_bf16
from engine.quant import int4_tile_layout
from engine.quant.nf4_linear import Nf4Linear
from tests.engine.helpers import captured
from tests.engine.quant.test_awq import CUDA, rel

bnbf = pytest.importorskip("bitsandbytes.functional")
SHAPE_05B = Path(__file__).resolve().parents[3] / "bench" / "qwen2.5-0.5b"


def bnb_layer(N: int, K: int, seed: int = 0, quant_type: str = "nf4", blocksize: int = 64,
              device: str = "cpu"):
    """A quantized bitsandbytes layer's parts, as Linear4bit holds them."""
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed)).to(device, torch.bfloat16)
    q, qs = bnbf.quantize_4bit(w, blocksize=blocksize, quant_type=quant_type,
                               compress_statistics=True)
    return SimpleNamespace(weight=SimpleNamespace(data=q, quant_state=qs), out_features=N,
                           in_features=K, bias=None), q, qs


def byte_perm(x: int, y: int, s: int) -> int:
    """CUDA's __byte_perm (prmt) for selectors of 0-7: byte n of the result is byte s_n of y:x."""
    both = x | y << 32
    return sum(((both >> 8 * ((s >> 4 * n) & 7)) & 0xFF) << 8 * n for n in range(4))


def code_word(v: int, tab: dict) -> list[int]:
    """code_word of kernels/int4_dequant_kernel.py step for step, with its source's tables."""
    def code_bytes(kind: str, s: int, m: int) -> int:
        t = [tab[f"{kind}{i}"] for i in range(4)]
        return byte_perm(byte_perm(t[0], t[1], s), byte_perm(t[2], t[3], s), m)

    s, m = v & 0x77777777, ((v >> 1) & 0x44444444) | 0x32103210
    lo, hi = code_bytes("L", s, m), code_bytes("H", s, m)
    lo2, hi2 = code_bytes("L", s >> 16, m >> 16), code_bytes("H", s >> 16, m >> 16)
    return [byte_perm(lo, hi, 0x5140), byte_perm(lo, hi, 0x7362),
            byte_perm(lo2, hi2, 0x5140), byte_perm(lo2, hi2, 0x7362)]


def test_the_code_is_bitsandbytes_nf4_and_the_kernels_look_it_up_in_bf16():
    assert torch.equal(torch.tensor(NF4_CODES), bnbf.get_4bit_type("nf4", device="cpu").float())
    tab = {line.split()[1]: int(line.split()[2].rstrip("u"), 16)
           for line in codebook_source(True).splitlines()
           if line.startswith("#define ") and line.split()[1][0] in "LH" and len(line.split()) == 3}
    assert sorted(tab) == ["H0", "H1", "H2", "H3", "L0", "L1", "L2", "L3"]
    want = [int(b) & 0xFFFF for b in nf4_bf16().view(torch.int16)]
    g = torch.Generator().manual_seed(5)
    words = [int(w) for w in torch.randint(0, 2**32, (400,), generator=g, dtype=torch.int64)]
    words += [sum(q << 4 * i for i in range(8)) for q in range(16)]  # every code everywhere
    for v in words:
        a = code_word(v, tab)
        for i in range(4):  # register i: the codes of nibbles 2i (low half) and 2i + 1
            assert a[i] & 0xFFFF == want[(v >> 8 * i) & 0xF], (hex(v), i)
            assert a[i] >> 16 == want[(v >> (8 * i + 4)) & 0xF], (hex(v), i)
    assert codebook_source(False) == "#define CODEBOOK 0\n"


def test_a_bitsandbytes_layer_comes_back_with_its_codes_and_its_weights():
    N, K = 48, 256
    module, q, qs = bnb_layer(N, K)
    lin = Nf4Linear.from_bnb(module)
    b = q.view(-1)
    codes = torch.stack((b >> 4, b & 0xF), dim=-1).view(N, K)
    assert torch.equal(int4_tile_layout.unpack(lin.packed, codebook=True), codes)  # the same codes
    ours, theirs = lin.dequantize().float(), bnbf.dequantize_4bit(q, qs).float()
    # bitsandbytes rounds code x absmax once; here code and absmax are bf16 first: three
    # roundings of at most 2^-8 relative each, against its one
    assert ((ours - theirs).abs() <= theirs.abs() * 2 ** -6).all()
    assert rel(ours, theirs) < 2 ** -8


@pytest.mark.parametrize("case", ["fp4", "block128", "rows40", "short_codes", "short_absmax"])
def test_what_the_layer_cannot_hold_stays_bitsandbytes(case):
    N, quant_type, blocksize = (40 if case == "rows40" else 48, "fp4" if case == "fp4" else "nf4",
                                128 if case == "block128" else 64)
    module, q, qs = bnb_layer(N, 256, quant_type=quant_type, blocksize=blocksize)
    if case == "short_codes":  # a malformed checkpoint: fewer codes than the layer's shape
        module.weight.data = q[:-16]
    if case == "short_absmax":
        qs.absmax = qs.absmax[:-1]
    assert Nf4Linear.from_bnb(module) is None


def test_fused_members_are_views_and_keep_their_weights():
    mods = [Nf4Linear.from_bnb(bnb_layer(n, 256, seed=n)[0]) for n in (64, 32, 32)]
    alone = [m.dequantize() for m in mods]
    fused = Nf4Linear.concat(mods)
    assert type(fused) is Nf4Linear
    assert torch.equal(fused.dequantize(), torch.cat(alone))
    for m, a in zip(mods, alone, strict=True):
        assert m.packed.data_ptr() >= fused.packed.data_ptr()
        assert torch.equal(m.dequantize(), a)


@CUDA
@pytest.mark.parametrize("N, K", [(4608, 3584), (37888, 3584), (3584, 18944), (208, 512)])
def test_the_codebook_products_equal_the_dequantized_reference(N, K):
    from engine.kernels.int4_dequant_kernel import dequant

    lin = Nf4Linear.from_bnb(bnb_layer(N, K, seed=N, device="cuda")[0])
    w = lin.dequantize()
    buf = torch.full((N * K,), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert torch.equal(dequant(lin.packed, lin.scales_zeros, 64, 0, N, buf, True), w)
    assert torch.equal(dequant(lin.packed, lin.scales_zeros, 64, 16, N - 32, buf, True),
                       w[16:N - 16])
    g = torch.Generator().manual_seed(K)
    x = torch.randn(512, K, generator=g).to("cuda", torch.bfloat16)
    for rows in (1, 2, 3, 4, 5, 16, 65, 512):
        out = lin(x[:rows])
        assert out.shape == (rows, N) and rel(out, x[:rows].float() @ w.float().t()) < 1e-2
    few = lin(x[:4])
    for i in range(4):  # the gemv's rows: the same bits alone
        assert torch.equal(lin(x[i:i + 1]), few[i:i + 1])


@CUDA
@pytest.mark.parametrize("LUT", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("S, SPLITS, XPRE", [(4, 1, 1), (8, 2, 0), (4, 4, 1)])
def test_every_codebook_gemv_launch_gives_the_reference_product(LUT, S, SPLITS, XPRE):
    """Every share of a k-group's words between the shared table and the byte permutes."""
    from engine.kernels import int4_gemv_kernel

    N, K = 208, 1152  # 18 k-groups: uneven shares, some warps with none
    lin = Nf4Linear.from_bnb(bnb_layer(N, K, seed=LUT + S, device="cuda")[0])
    w = lin.dequantize().float()
    launch = dict(S=S, SPLITS=SPLITS, G=64, XPRE=XPRE, LUT=LUT)
    x = torch.randn(8, K, generator=torch.Generator().manual_seed(9)).to("cuda", torch.bfloat16)
    for rows in (1, 3, 8):
        out = int4_gemv_kernel.matmul(x[:rows], lin.packed, lin.scales_zeros, 64, launch, True)
        assert rel(out, x[:rows].float() @ w.t()) < 1e-2, rows


@CUDA
def test_the_codebook_gemvs_silu_times_up_has_the_bits_of_the_product_then_the_piece():
    from engine.kernels.fused_ops_kernel import silu_mul

    lin = Nf4Linear.from_bnb(bnb_layer(37888, 3584, seed=7, device="cuda")[0])
    lin.glu = True  # as choose_glu sets it where the launch measured faster
    x = torch.randn(4, 3584, generator=torch.Generator().manual_seed(8)).to(
        "cuda", torch.bfloat16) * 4
    for rows in (1, 2, 3, 4):
        assert torch.equal(lin.silu_glu(x[:rows]), silu_mul(lin(x[:rows]))), rows


@CUDA
def test_codebook_graph_replays_equal_eager_calls():
    lin = Nf4Linear.from_bnb(bnb_layer(3584, 3584, seed=5, device="cuda")[0])
    x = torch.randn(1, 3584, generator=torch.Generator().manual_seed(6)).to(
        "cuda", torch.bfloat16)
    eager = lin(x)
    graph, out = captured(lambda: lin(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


@CUDA
def test_a_model_loaded_nf4_runs_the_engines_layers_as_close_as_bitsandbytes_ones():
    """The yardstick: both models against the same NF4 weights dequantized exactly (fp32)."""
    import copy

    import bitsandbytes as bnb

    from engine.config.backends import Backends
    from engine.events import LoadRequest
    from engine.files.model_folder import config_only_folder
    from engine.load import loader

    folder = config_only_folder(str(SHAPE_05B))
    req = LoadRequest(model=str(SHAPE_05B), device="cuda", quant="nf4", context=256)
    ours = loader.random_model(folder, req).model
    theirs = loader.random_model(folder, req, Backends(int4_kernel="reference")).model
    kinds = lambda m: {type(x).__name__ for x in m.modules()}  # noqa: E731
    assert "Nf4Linear" in kinds(ours) and "Linear4bit" not in kinds(ours)
    assert not any(isinstance(x, Nf4Linear) for x in theirs.modules())
    exact = copy.deepcopy(theirs)
    for parent in list(exact.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, bnb.nn.Linear4bit):
                w = bnbf.dequantize_4bit(child.weight.data, child.weight.quant_state).float()
                plain = torch.nn.Linear(child.in_features, child.out_features, bias=False)
                plain.weight = torch.nn.Parameter(w, requires_grad=False)
                if child.bias is not None:
                    plain.bias = torch.nn.Parameter(child.bias.data.float(), requires_grad=False)
                setattr(parent, name, plain)
    exact = exact.float()
    ids = torch.randint(0, 1000, (1, 24), generator=torch.Generator().manual_seed(0)).cuda()
    for m in (ours, theirs, exact):  # transformers' own attention: no engine cache around it
        m.set_attn_implementation("sdpa")
    with torch.no_grad():
        a, b, ref = (m(ids).logits.float() for m in (ours, theirs, exact))
    assert 0 < rel(b, ref) and rel(a, ref) <= 1.5 * rel(b, ref), (rel(a, ref), rel(b, ref))


@pytest.mark.parametrize("device, kernel, swapped", [
    ("cuda", None, True), ("cuda", "mma", True), ("cuda", "reference", False),
    ("cuda", "tinygemm", False), ("cpu", None, False)])
def test_the_loader_swaps_nf4_layers_on_a_gpu_unless_told_otherwise(monkeypatch, device, kernel,
                                                                    swapped):
    from engine.config.backends import Backends
    from engine.load import weight_loaders
    from engine.quant import nf4_linear

    calls = []
    monkeypatch.setattr(nf4_linear, "convert", calls.append)
    model = torch.nn.Linear(4, 4)
    for quant in ("nf4", "awq"):
        weight_loaders.of(quant).own(model, torch.device(device), Backends(int4_kernel=kernel))
    assert calls == ([model] if swapped else [])
