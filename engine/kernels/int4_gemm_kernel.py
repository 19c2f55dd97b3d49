"""A Triton GEMM over torch's tinygemm int4 layout: the weights stay as tinygemm packed
them for decode, and a prefill chunk (or a batch of many rows) dequantizes each tile in
registers on its way to the tensor cores, instead of unpacking the whole layer to 16 bits first.

The layout (quant/tinygemm_layout.py): packed [N/8, K/(16 T), 32, T/2] int32; lane t = 4a + b of
element [nt, ko, t, j] holds, in nibble p = 4h + i, the code of n = 8 nt + a and
k = 16 T ko + 32 j + 8 i + 2 b + h. For one ko, the words of output row n = 8 nt + a are the
4 T/2 words at lanes 4a..4a+3: contiguous. Their nibbles, taken in memory order (b, j, h, i),
are k in a fixed permutation of the tile's 16 T columns; so the caller puts x's columns in that
order once per call (quant/tinygemm_layout.to_nibble_order, one pass over x), and the tile is a
plain dot product of x' [BM, 16 T] and the dequantized codes [BN, 16 T]. A group of G >= 32
columns covers whole j's (8 i + 2 b + h < 32), so each word's scale and offset depend on j
alone.

Imported only where Triton imports (CUDA, or TRITON_INTERPRET=1 in tests); tested against the
dequantized reference (quant/int4_linear.py).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _tinygemm_mm(X, W, SZ, OUT, M, N, KO, stride_xm, stride_sg, stride_sn, stride_om,
                 G: tl.constexpr, J: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, F32_DOT: tl.constexpr):
    """X: x' [M, K] (to_nibble_order); W: tinygemm's packed int32; SZ: [K/G, N, 2] (scale,
    offset): W[n, k] = (q - 8) scale + offset; OUT: [M, N]. BLOCK_N is a multiple of 8."""
    KB: tl.constexpr = 32 * J  # = 16 T columns a tile
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = m < M, n < N
    b = tl.arange(0, 4)
    j = tl.arange(0, J)
    p = tl.arange(0, 8)
    kk = tl.arange(0, KB)
    # word [nt, ko, 4 a + b, j] of row n = 8 nt + a: ((nt KO + ko) 32 + 4 a + b) J + j
    row = (n // 8) * (KO * 32 * J) + (n % 8) * (4 * J)  # [BLOCK_N], at ko = 0
    lane = b[:, None] * J + j[None, :]  # [4, J]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for ko in range(KO):
        w = tl.load(W + row[:, None, None] + ko * (32 * J) + lane[None, :, :],
                    mask=n_ok[:, None, None], other=0)  # [BN, 4, J] int32
        q = ((w[:, :, :, None] >> (p * 4)[None, None, None, :]) & 0xF).to(tl.float32)
        g = (ko * KB + 32 * j) // G  # [J]: the group of each j
        sz = SZ + g[None, :] * stride_sg + n[:, None] * stride_sn  # [BN, J]
        s = tl.load(sz, mask=n_ok[:, None], other=0.0).to(tl.float32)
        off = tl.load(sz + 1, mask=n_ok[:, None], other=0.0).to(tl.float32)
        wt = (q - 8.0) * s[:, None, :, None] + off[:, None, :, None]  # [BN, 4, J, 8]
        wt = tl.reshape(wt, (BLOCK_N, KB))
        x = tl.load(X + m[:, None] * stride_xm + ko * KB + kk[None, :], mask=m_ok[:, None],
                    other=0.0)  # [BM, KB]
        if F32_DOT:  # Triton's CPU interpreter multiplies bf16 wrongly (3.9): fp32 there
            acc += tl.dot(x.to(tl.float32), tl.trans(wt))
        else:  # 16-bit operands on the tensor cores, fp32 accumulation
            acc += tl.dot(x, tl.trans(wt.to(X.dtype.element_ty)))
    tl.store(OUT + m[:, None] * stride_om + n[None, :], acc.to(OUT.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def default_config(M: int, N: int) -> dict:
    """Tiles for a shape: a prefill chunk takes 128 x 128 tiles, a few rows narrower ones.
    Untuned: a GPU sweep (bench/int4_gemm.py) is what should set these."""
    block_m = 16 if M <= 16 else 32 if M <= 32 else 64 if M <= 64 else 128
    return dict(BLOCK_M=block_m, BLOCK_N=128 if N >= 128 else 64, num_warps=4 if M <= 64 else 8,
                num_stages=3)


def tinygemm_matmul(xp: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, G: int,
                    config: dict | None = None) -> torch.Tensor:
    """x [M, K] @ W^T -> [M, N] in x's dtype, given xp = to_nibble_order(x, T)
    (quant/tinygemm_layout.py), W in tinygemm's layout `packed` [N/8, K/(16 T), 32, T/2] with
    scales_zeros [K/G, N, 2] (any strides, dense last dim)."""
    M, K = xp.shape
    NT, KO, lanes, J = packed.shape
    N = NT * 8
    if lanes != 32 or K != KO * 32 * J or G % 32 or packed.stride(3) != 1 \
            or packed.stride(2) != J or packed.stride(1) != 32 * J:
        raise ValueError(f"a tinygemm layout {tuple(packed.shape)} for K={K}, G={G}")
    cfg = config or default_config(M, N)
    xp = xp.contiguous()
    out = torch.empty(M, N, dtype=xp.dtype, device=xp.device)
    grid = (triton.cdiv(M, cfg["BLOCK_M"]), triton.cdiv(N, cfg["BLOCK_N"]))
    _tinygemm_mm[grid](xp, packed, scales_zeros, out, M, N, KO, xp.stride(0),
                       scales_zeros.stride(0), scales_zeros.stride(1), out.stride(0), G=G, J=J,
                       BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], F32_DOT=INTERPRETED,
                       num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out
