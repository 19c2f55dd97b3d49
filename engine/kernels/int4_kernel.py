"""A split-K GEMV in Triton for Int4Linear's own layout ("triton" kernel in quant/int4_linear.py).

Decode multiplies one row (a few for speculative verification) by every weight matrix: a
memory-bound product where the grid must cover the GPU even when N is small. So each program
takes BLOCK_N outputs and a 1/SPLIT_K share of K; split partials are summed in fp32 afterwards
(deterministic, unlike atomics: graph replays and eager steps agree bit for bit).
Imported only where Triton imports (CUDA, or TRITON_INTERPRET=1 in tests); the reference in
quant/int4_linear.py (dequantize, then matmul) is what this is tested against.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def _int4_mm(X, W, SZ, OUT, M, N, stride_xm, stride_wn, stride_sg, stride_sn, stride_os,
             stride_om, k_per_split, G: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr):
    """X: [M, K] 16-bit; W: [N, K/8] int32 (k = 8 w + j in bits 4j..4j+3 of word w); SZ:
    [K/G, N, 2] (scale, offset), W[n, k] = (q - 8) scale + offset; OUT: [SPLIT_K, M, N]
    partials (fp32), or [M, N] when there is one split. A tile never straddles a group
    (G % BLOCK_K == 0), so it has one scale and one offset per output."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    words = tl.arange(0, BLOCK_K // 8)
    j = tl.arange(0, 8)
    k_lo = split * k_per_split
    if DOT:
        m = tl.arange(0, BLOCK_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    else:
        acc = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_lo + k_per_split, BLOCK_K):
        w = tl.load(W + n[:, None] * stride_wn + (k0 // 8 + words)[None, :], mask=n_ok[:, None],
                    other=0)  # [BLOCK_N, BLOCK_K / 8] int32
        q = ((w[:, :, None] >> (j * 4)[None, None, :]) & 0xF).to(tl.float32)  # [BN, BK/8, 8]
        sz = SZ + (k0 // G) * stride_sg + n * stride_sn
        s = tl.load(sz, mask=n_ok, other=0.0).to(tl.float32)  # [BLOCK_N]
        off = tl.load(sz + 1, mask=n_ok, other=0.0).to(tl.float32)
        if DOT:  # a few rows: dequantize the tile once, multiply on tensor cores (tf32: the
            # 16-bit x is exact in it, and the weights round more finely than to bf16)
            wt = tl.reshape((q - 8.0) * s[:, None, None] + off[:, None, None], (BLOCK_N, BLOCK_K))
            k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(X + m[:, None] * stride_xm + k[None, :], mask=(m < M)[:, None], other=0.0)
            acc += tl.dot(x.to(tl.float32), tl.trans(wt))
        else:  # one row: sum_k ((q-8) s + off) x_k = s (sum_k q x_k) + (off - 8 s) (sum_k x_k)
            x = tl.load(X + k0 + words[:, None] * 8 + j[None, :]).to(tl.float32)  # [BK/8, 8]
            qx = tl.sum(tl.sum(q * x[None, :, :], axis=2), axis=1)  # [BLOCK_N]
            acc += s * qx + (off - 8.0 * s) * tl.sum(tl.sum(x, axis=1), axis=0)
    out = OUT + split * stride_os
    if DOT:
        tl.store(out + m[:, None] * stride_om + n[None, :], acc.to(OUT.dtype.element_ty),
                 mask=(m < M)[:, None] & n_ok[None, :])
    else:
        tl.store(out + n, acc.to(OUT.dtype.element_ty), mask=n_ok)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def default_config(M: int, N: int, K: int, G: int, device: torch.device) -> dict:
    """Tiles and split for a shape: enough programs for ~4 per SM, each a whole number of
    BLOCK_K tiles inside its share of K. Other tiles win some, never enough to catch tinygemm,
    the CUDA default (awq_speed.py's sweep, docs/benchmark-log.md); so these stay."""
    block_k = min(128, G)
    block_n = 64 if M == 1 else 32
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 132
    tiles, n_blocks = K // block_k, triton.cdiv(N, block_n)
    want = max(1, -(-4 * sms // n_blocks))
    split = max(d for d in range(1, min(want, tiles) + 1) if tiles % d == 0)
    return dict(BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split, num_warps=4)


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, G: int,
                config: dict | None = None) -> torch.Tensor:
    """x: [M, K] (M <= 16) @ W^T -> [M, N] in x's dtype. packed: [N, K/8] int32 (rows may be a
    view); scales_zeros: [K/G, N, 2], any strides but a dense last dim."""
    M, K = x.shape
    N = packed.shape[0]
    cfg = config or default_config(M, N, K, G, x.device)
    block_k, split = cfg["BLOCK_K"], cfg["SPLIT_K"]
    if G % block_k or K % (block_k * split) or packed.stride(1) != 1:
        raise ValueError(f"int4 GEMV config {cfg} does not fit K={K}, G={G}")
    x = x.contiguous()
    dot = M > 1
    out = (torch.empty(split, M, N, dtype=torch.float32, device=x.device) if split > 1
           else torch.empty(1, M, N, dtype=x.dtype, device=x.device))
    grid = (triton.cdiv(N, cfg["BLOCK_N"]), split)
    _int4_mm[grid](x, packed, scales_zeros, out, M, N, x.stride(0), packed.stride(0),
                   scales_zeros.stride(0), scales_zeros.stride(1), out.stride(0), out.stride(1),
                   K // split, G=G, BLOCK_M=16 if dot else 1, BLOCK_N=cfg["BLOCK_N"],
                   BLOCK_K=block_k, DOT=dot, num_warps=cfg["num_warps"])
    return out[0] if split == 1 else out.sum(0).to(x.dtype)
