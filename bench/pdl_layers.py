"""A decode step's layers on one GPU under HEARTH_PDL=off, products and auto: the
launches of a 7B layer at one row (the residual norm, the q/k/v gemv, decode attention's two
programs over 1,024 keys, the o gemv, the norm, the gate/up gemv with SiLU * up, the down gemv)
for every layer of the shape, distinct random weights each (AWQ group 128, or NF4), captured as
one CUDA graph and timed by CUDA events over its replays; each mode's output checked equal to
"off"'s bit for bit. Prints one JSON line a mode:

    python3 bench/pdl_layers.py [--nf4] [--layers 28] [--reps 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.cache.kv_cache import LayerKV  # noqa: E402
from engine.kernels import decode_attention_kernel as attn  # noqa: E402
from engine.kernels import fused_ops_kernel as K  # noqa: E402
from engine.kernels import int4_gemv_kernel  # noqa: E402
from engine.platform import nvrtc  # noqa: E402
from engine.platform.device_timing import event_times_ms  # noqa: E402
from engine.quant.int4_linear import Int4Linear  # noqa: E402
from engine.quant.nf4_linear import Nf4Linear  # noqa: E402

HIDDEN, INNER, HEADS, KV_HEADS, D = 3584, 18944, 28, 4, 128  # Qwen2.5-7B


def linear(N: int, K_: int, nf4: bool):
    codes = torch.randint(0, 16, (N, K_), device="cuda", dtype=torch.uint8)
    if nf4:
        return Nf4Linear.from_codes_absmax(codes, torch.rand(N, K_ // 64, device="cuda") + 0.1,
                                           None)
    zeros = torch.randint(0, 16, (K_ // 128, N), device="cuda", dtype=torch.uint8)
    scales = torch.rand(K_ // 128, N, device="cuda") * 0.02 + 0.001
    return Int4Linear.from_codes(codes, zeros, scales, None, torch.bfloat16,
                                 torch.device("cuda"), kernel="mma")


def layer(nf4: bool) -> dict:
    gate_up = linear(2 * INNER, HIDDEN, nf4)
    gate_up.glu = True
    k, v = (torch.randn(8, KV_HEADS, 128, D, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    return dict(qkv=linear((HEADS + 2 * KV_HEADS) * D, HIDDEN, nf4), o=linear(HIDDEN, HIDDEN, nf4),
                gate_up=gate_up, down=linear(HIDDEN, INNER, nf4),
                kv=LayerKV(k, v, None, None, torch.arange(8, dtype=torch.int32, device="cuda")),
                w=torch.rand(HIDDEN, device="cuda", dtype=torch.bfloat16) + 0.5)


def step(layers: list[dict], x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """As FamilyStep runs a layer (no RoPE launch: q is the product's slice)."""
    res, delta = x, None
    for L in layers:
        if delta is None:
            h = K.rms(res, L["w"], 1e-6)
        else:
            res, h = K.add_rms(res, delta, L["w"], 1e-6)
        q = L["qkv"](h)[:, :HEADS * D].view(1, HEADS, 1, D)
        a = attn.decode_attention(q, L["kv"], pos, 1024, D ** -0.5, None)
        res, h = K.add_rms(res, L["o"](a.reshape(1, HEADS * D)), L["w"], 1e-6)
        delta = L["down"](L["gate_up"].silu_glu(h))
    return K.add_rms(res, delta, layers[0]["w"], 1e-6)[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nf4", action="store_true")
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    torch.manual_seed(0)
    layers = [layer(args.nf4) for _ in range(args.layers)]
    x = torch.randn(1, HIDDEN, device="cuda", dtype=torch.bfloat16)
    pos = torch.tensor([900], device="cuda")
    first = None
    for mode in ("off", "products", "auto", "off", "auto"):
        nvrtc.use_pdl(mode)  # as a load under HEARTH_PDL=mode sets it
        int4_gemv_kernel._plan.cache_clear()
        int4_gemv_kernel._product.cache_clear()
        out = step(layers, x, pos)
        first = out if first is None else first
        ms = event_times_ms(lambda: step(layers, x, pos), args.reps, graphed=True)
        print(json.dumps(dict(mode=mode, nf4=args.nf4, layers=args.layers,
                              median_ms=round(statistics.median(ms), 4),
                              min_ms=round(min(ms), 4), same_bits=bool(torch.equal(out, first)),
                              pieces=K.pdl_options(x.device, 1))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
