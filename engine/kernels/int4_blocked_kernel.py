"""An int4 product in Triton over the blocked AWQ layout (quant/int4_blocked_layout.py), for every
row count: decode (1 to 16 rows) and prefill (hundreds) on one copy of the weights (issue 28).

NOT chosen by the engine: on the H200 (2026-12-03, BENCHMARKS.md) it reads 0.5-1.0 TB/s at one
row against tinygemm's 1.0-1.9, and wins only the gate/up product at 16 rows. It stays as the
measured starting point for issue 28's GEMV, with its sweep (packaging/bench/int4_blocked.py).

Turning a code into a float can cost more than reading it (an int-to-float conversion runs at a
fraction of the FMA rate), so a code becomes a float by its bits: q | 0x4B000000 is the fp32
2^23 + q, and one subtraction makes it exactly BASE + q. The group's scale s and offset o are
applied once per group and output, not per code:
    sum_k ((q - 8) s + o) x_k = s * sum_k (BASE + q) x_k + (o - (BASE + 8) s) * sum_k x_k
in fp32 (BASE + q is exact in the 16-bit dtype too, for the tensor cores). One row multiplies
on the FMA units; more rows, padded to 16, on the tensor cores.
Imported only where Triton imports (CUDA, or TRITON_INTERPRET=1 in tests); tested against the
dequantized reference (quant/int4_linear.py).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
BASES = {torch.bfloat16: 128.0, torch.float16: 1024.0}  # BASE + q is exact in the dtype


@triton.jit
def _codes(w, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, BASE: tl.constexpr,
           BITS: tl.constexpr):
    """words [BK, BN/8] -> [BK, BN] floats of value BASE + q, column 8 c + 2 j + h."""
    o = tl.arange(0, 8)  # output 2 j + h of a word sits in nibble j + 4 h
    q = (w[:, :, None] >> (4 * (o // 2 + 4 * (o % 2)))[None, None, :]) & 0xF
    if BITS:  # one code to an fp32 of value 2^23 + q by its bits, then exactly BASE + q
        f = (q | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 - BASE)
    else:  # the same values by arithmetic (Triton's interpreter has no such bitcast)
        f = q.to(tl.float32) + BASE
    return tl.reshape(f, (BLOCK_K, BLOCK_N))


@triton.jit
def _blocked_mm(X, W, SZ, OUT, M, N, K, stride_xm, stride_sg, stride_sn, stride_om,
                G: tl.constexpr, LBN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, DOT: tl.constexpr, BASE: tl.constexpr,
                BITS: tl.constexpr, F32_DOT: tl.constexpr, TRANS: tl.constexpr,
                ACC2D: tl.constexpr):
    """X [M, K]; W [N / LBN, K, LBN / 8] int32; SZ [K / G, N, 2] (scale, offset) with
    W[n, k] = (q - 8) scale + offset; OUT [M, N]. DOT: BLOCK_K <= G; else BLOCK_M = 1."""
    C: tl.constexpr = LBN // 8  # words a k of one block
    NG: tl.constexpr = BLOCK_K // G if BLOCK_K > G else 1  # groups a tile
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    c = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)  # the tile's word columns
    col = (c // C) * (K * C) + c % C  # word (k = 0, c)
    c_ok = c < N // 8
    kk = tl.arange(0, BLOCK_K)
    if DOT:
        m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    else:
        acc = tl.zeros([BLOCK_N], tl.float32)
        acc3 = tl.zeros([NG, BLOCK_K // NG, BLOCK_N], tl.float32)  # ACC2D: reduced once, at the end
    for k0 in range(0, K, BLOCK_K):
        w = tl.load(W + col[None, :] + (k0 + kk)[:, None] * C, mask=c_ok[None, :],
                    other=0)  # [BK, BN/8] int32
        t = _codes(w, BLOCK_K, BLOCK_N, BASE, BITS)  # [BK, BN]: BASE + q
        g = k0 // G + tl.arange(0, NG)  # [NG]
        sz = SZ + g[:, None] * stride_sg + n[None, :] * stride_sn  # [NG, BN]
        s = tl.load(sz, mask=n_ok[None, :], other=0.0).to(tl.float32)
        off = tl.load(sz + 1, mask=n_ok[None, :], other=0.0).to(tl.float32) - (BASE + 8.0) * s
        if DOT:
            x = tl.load(X + m[:, None] * stride_xm + (k0 + kk)[None, :], mask=(m < M)[:, None],
                        other=0.0)  # [BM, BK]
            if F32_DOT:  # the interpreter multiplies 16-bit operands wrongly (Triton 3.9)
                d = tl.dot(x.to(tl.float32), t.to(tl.float32))
            elif TRANS:  # the weights as the register operand (wgmma takes A from registers)
                d = tl.trans(tl.dot(tl.trans(t.to(X.dtype.element_ty)), tl.trans(x)))
            else:  # 16-bit operands on the tensor cores, fp32 accumulation
                d = tl.dot(x, t.to(X.dtype.element_ty))
            xs = tl.sum(x.to(tl.float32), axis=1)  # [BM]
            acc += d * tl.reshape(s, (BLOCK_N,))[None, :] \
                + xs[:, None] * tl.reshape(off, (BLOCK_N,))[None, :]
        else:
            x = tl.load(X + k0 + kk).to(tl.float32)  # [BK]
            x3 = tl.reshape(x, (NG, BLOCK_K // NG))
            if ACC2D:  # no reduction across threads inside the loop
                t3 = tl.reshape(t.to(tl.float32), (NG, BLOCK_K // NG, BLOCK_N))
                acc3 += t3 * (x3[:, :, None] * s[:, None, :])
                acc += tl.sum(tl.sum(x3, axis=1)[:, None] * off, axis=0)
            else:
                p = tl.reshape(t.to(tl.float32) * x[:, None], (NG, BLOCK_K // NG, BLOCK_N))
                d = tl.sum(p, axis=1)  # [NG, BN]
                acc += tl.sum(d * s + tl.sum(x3, axis=1)[:, None] * off, axis=0)
    if DOT:
        tl.store(OUT + m[:, None] * stride_om + n[None, :], acc.to(OUT.dtype.element_ty),
                 mask=(m < M)[:, None] & n_ok[None, :])
    else:
        acc += tl.sum(tl.sum(acc3, axis=1), axis=0)
        tl.store(OUT + n, acc.to(OUT.dtype.element_ty), mask=n_ok)


def default_config(M: int, N: int, K: int, G: int, lbn: int) -> dict:
    """Tiles for a shape. Decode: one layout block a program, all of K; prefill: 64 x 128 tiles.
    To be set by the H200 sweep (packaging/bench/int4_blocked.py)."""
    if M == 1:
        return dict(BLOCK_M=1, BLOCK_N=lbn, BLOCK_K=max(256, G), num_warps=4, num_stages=3)
    if M <= 16:
        return dict(BLOCK_M=16, BLOCK_N=max(16, lbn), BLOCK_K=min(G, 128), num_warps=4,
                    num_stages=3)
    block_m = 32 if M <= 32 else 64 if M <= 64 else 128
    return dict(BLOCK_M=block_m, BLOCK_N=128, BLOCK_K=min(G, 64), num_warps=4 if M <= 64 else 8,
                num_stages=3)


def blocked_matmul(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, G: int,
                   config: dict | None = None) -> torch.Tensor:
    """x [M, K] @ W^T -> [M, N] in x's dtype (bf16 or fp16); packed [N / LBN, K, LBN / 8] int32
    (a block-aligned slice of rows may be a view), scales_zeros [K/G, N, 2] (dense last dim)."""
    M, K = x.shape
    NB, Kp, C = packed.shape
    lbn, N = 8 * C, NB * 8 * C
    cfg = dict(config or default_config(M, N, K, G, lbn))
    dot = cfg["BLOCK_M"] > 1
    bk = cfg["BLOCK_K"]
    if Kp != K or K % bk or (dot and G % bk) or (not dot and bk % G and G % bk) \
            or packed.stride(2) != 1 or packed.stride(1) != C or packed.stride(0) != K * C \
            or x.dtype not in BASES:
        raise ValueError(f"an int4 blocked layout {tuple(packed.shape)} for K={K}, G={G}, "
                         f"{x.dtype}, config {cfg}")
    if not dot and M != 1:
        raise ValueError(f"the FMA path takes one row, not {M}")
    x = x.contiguous()
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
    cfg.setdefault("TRANS", True)  # faster at every shape measured (BENCHMARKS.md)
    cfg.setdefault("ACC2D", False)
    grid = (triton.cdiv(N, cfg["BLOCK_N"]), triton.cdiv(M, cfg["BLOCK_M"]))
    _blocked_mm[grid](x, packed, scales_zeros, out, M, N, K, x.stride(0), scales_zeros.stride(0),
                      scales_zeros.stride(1), out.stride(0), G=G, LBN=lbn, DOT=dot,
                      BASE=BASES[x.dtype], BITS=not INTERPRETED, F32_DOT=INTERPRETED,
                      num_warps=warps, num_stages=stages, **cfg)
    return out
