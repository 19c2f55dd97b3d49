"""The linear products of a 7B prefill at 512 rows (issue 28's TTFT), without attention: 28
layers' q/k/v, o, gate/up and down (four distinct random layers in turn, so the weights come
from memory), each way captured as one CUDA graph and replayed: bf16 weights through cuBLAS; AWQ
dequantized into the buffer then cuBLAS in one stream; dequantized ahead on a side stream
(quant/int4_ahead.py), at two stream priorities and with cuBLAS kept off some SMs
(torch._C._set_sm_carveout_experimental) so the dequantizing has SMs of its own.

    python3 packaging/bench/int4_ahead.py [--rows 512] [--carveouts 8 16 32]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from engine.quant import int4_ahead
from engine.quant.int4_linear import Int4Linear, random_codes

SHAPES = {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584),
          "down": (3584, 18944)}


def _layer(seed: int) -> list[Int4Linear]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for N, K in SHAPES.values():
        codes, zeros, scales = random_codes(N, K, 128, g)
        out.append(Int4Linear.from_codes(codes, zeros, scales, None, torch.bfloat16,
                                         torch.device("cuda"), kernel="mma"))
    return out


def _timed(fn, reps: int = 10) -> float:
    """ms a replay of fn captured as one graph (median of reps)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--carveouts", type=int, nargs="*", default=[8, 16, 32])
    a = p.parse_args()
    distinct = [_layer(i) for i in range(4)]
    seq = [lin for i in range(a.layers) for lin in distinct[i % 4]]
    dense = {id(lin): lin.dequantize().contiguous() for layer in distinct for lin in layer}
    xs = {K: torch.randn(a.rows, K, device="cuda", dtype=torch.bfloat16)
          for _, K in SHAPES.values()}

    def bf16():
        for lin in seq:
            torch.mm(xs[lin.in_features], dense[id(lin)].t())

    def serial():
        for lin in seq:
            lin(xs[lin.in_features])

    def ahead(side=None):
        def run():
            d = int4_ahead.DequantAhead(seq, side)
            for lin in seq:
                d.linear(xs[lin.in_features], lin)
        return run

    rows = {"bf16": _timed(bf16), "awq one stream": _timed(serial),
            "awq ahead": _timed(ahead())}
    lo, hi = torch.cuda.Stream.priority_range()
    rows["awq ahead, side stream high priority"] = _timed(ahead(torch.cuda.Stream(priority=hi)))
    for k in a.carveouts:
        try:
            torch._C._set_sm_carveout_experimental(k)
            rows[f"bf16, cuBLAS carveout {k}"] = _timed(bf16)
            rows[f"awq ahead, cuBLAS carveout {k}"] = _timed(ahead())
            rows[f"awq ahead high priority, carveout {k}"] = _timed(
                ahead(torch.cuda.Stream(priority=hi)))
        except Exception as e:  # noqa: BLE001 - a torch without it: say so, go on
            print(json.dumps({"carveout": k, "error": f"{type(e).__name__}: {e}"}), flush=True)
        finally:
            torch._C._set_sm_carveout_experimental(None)
    for name, ms in rows.items():
        print(json.dumps({"rows": a.rows, "layers": a.layers, "variant": name,
                          "ms": round(ms, 3), "x_bf16": round(ms / rows["bf16"], 3)}),
              flush=True)


if __name__ == "__main__":
    main()
