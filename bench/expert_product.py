"""The grouped expert product over 4-bit experts on a GPU, at one Qwen3-30B-A3B layer's sizes
(128 experts, top-8, 2048 -> 768): the Triton kernel against the fp32 product of the dequantized
weights (no farther than the bf16 reference), idle experts' scales NaN (nothing read from them),
replayed as a CUDA graph, then its time against the 16-bit kernel's at 1-64 rows.

    PYTHONPATH=. python bench/expert_product.py
"""

import torch

from engine.kernels.experts import grouped
from engine.quant import experts4

torch.backends.cuda.matmul.allow_tf32 = False
g = torch.Generator().manual_seed(0)
E, H, W, K = 128, 2048, 768, 8
w_gu = torch.randn(E, 2 * W, H, generator=g) * 0.02
w_dn = torch.randn(E, H, W, generator=g) * 0.02
bf = (w_gu.to("cuda", torch.bfloat16), w_dn.to("cuda", torch.bfloat16))


def rel(a, b):
    return ((a.float() - b).norm() / b.norm()).item()


def timed(fn, n=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / n * 1e3  # us


ok = True
for quant in ("awq", "nf4"):
    gu, dn = (experts4.quantize(w, quant, torch.bfloat16, torch.device("cuda"))
              for w in (w_gu, w_dn))
    exact = [torch.stack([p[e].float() for e in range(E)]) for p in (gu, dn)]
    for T in (1, 16, 300):
        x = torch.randn(T, H, generator=g).to("cuda", torch.bfloat16)
        ids, weights = grouped.route(torch.randn(T, E, generator=g).cuda(), K, normalize=True)
        got = grouped.product(x, gu, dn, ids, weights, kernel="triton")
        want = grouped.product(x.float(), *exact, ids, weights)
        ref16 = grouped.product(x, gu, dn, ids, weights)
        idle = sorted(set(range(E)) - set(ids.flatten().tolist()))
        saved = [p.scales[idle].clone() for p in (gu, dn)]
        for p in (gu, dn):
            p.scales[idle] = float("nan")
        poisoned = grouped.product(x, gu, dn, ids, weights, kernel="triton")
        for p, s in zip((gu, dn), saved, strict=True):
            p.scales[idle] = s
        k_err, r_err = rel(got, want), rel(ref16, want)
        good = (bool(torch.isfinite(got).all()) and k_err <= 1.5 * r_err
                and torch.equal(poisoned, got))
        ok &= good
        print(f"{quant} T={T}: kernel {k_err:.3e} reference-bf16 {r_err:.3e} poisoned-equal "
              f"{torch.equal(poisoned, got)} {'ok' if good else 'FAIL'}", flush=True)
    # captured as a CUDA graph (the decode step's): replay equals eager
    x = torch.randn(4, H, generator=g).to("cuda", torch.bfloat16)
    ids, weights = grouped.route(torch.randn(4, E, generator=g).cuda(), K, normalize=True)
    eager = grouped.product(x, gu, dn, ids, weights, kernel="triton")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        grouped.product(x, gu, dn, ids, weights, kernel="triton")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = grouped.product(x, gu, dn, ids, weights, kernel="triton")
    graph.replay()
    torch.cuda.synchronize()
    same = torch.equal(out, eager)
    ok &= same
    print(f"{quant} graph replay equals eager: {same}", flush=True)
    for T in (1, 4, 16, 64):
        x = torch.randn(T, H, generator=g).to("cuda", torch.bfloat16)
        ids, weights = grouped.route(torch.randn(T, E, generator=g).cuda(), K, normalize=True)
        n_routed = len(set(ids.flatten().tolist()))
        args = (x, ids, weights)
        t4 = timed(lambda a=args, w=(gu, dn): grouped.product(a[0], *w, *a[1:], kernel="triton"))
        t16 = timed(lambda a=args: grouped.product(a[0], *bf, *a[1:], kernel="triton"))
        b4 = n_routed * 3 * W * H * (0.5 + (4 / 128 if quant == "awq" else 2 / 64))
        b16 = n_routed * 3 * W * H * 2
        print(f"  {quant} T={T} ({n_routed} experts read): 4-bit {t4:.1f} us "
              f"({b4 / t4 / 1e3:.0f} GB/s)  bf16 {t16:.1f} us ({b16 / t16 / 1e3:.0f} GB/s)",
              flush=True)
print("ALL OK" if ok else "SOME FAILED")
