"""The grouped expert product in Triton (the reference: grouped.py): two launches over the
plan's blocks, each block BLOCK_M slots of one expert. The first reads that expert's [gate; up]
rows and writes SiLU(gate) * up per slot; the second reads its down rows and writes each slot's
output. A block of expert -1 returns before reading anything: only routed experts are read.

Imported only where Triton imports (CUDA, or TRITON_INTERPRET=1 in tests).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from engine.kernels.experts.grouped import BLOCK_M, Plan

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK_N, BLOCK_K = 32, 32


@triton.jit
def _dot(a, b, F32_DOT: tl.constexpr):
    if F32_DOT:  # fp32 weights, and Triton's CPU interpreter (it multiplies bf16 wrongly)
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)  # 16-bit operands on the tensor cores, fp32 accumulation


@triton.jit
def _gate_up(X, W, ACT, ORDER, B_EXPERT, B_START, B_END, TOP_K, H, WIDTH, stride_x,
             stride_we, stride_wn, stride_a, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, F32_DOT: tl.constexpr):
    """ACT[s, n] = SiLU(x_t . gate_e[n]) * (x_t . up_e[n]) for the block's slots s (token
    t = s // TOP_K) and columns n of this program; W: [E, 2 WIDTH, H] (WIDTH: an expert's
    intermediate size)."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    e = tl.load(B_EXPERT + pid_m)
    if e >= 0:
        r = tl.load(B_START + pid_m) + tl.arange(0, BLOCK_M)
        ok = r < tl.load(B_END + pid_m)
        slot = tl.load(ORDER + r, mask=ok, other=0)
        token = slot // TOP_K
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < WIDTH
        w = W + e.to(tl.int64) * stride_we
        gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, H, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            k_ok = kk < H
            x = tl.load(X + token[:, None] * stride_x + kk[None, :],
                        mask=ok[:, None] & k_ok[None, :], other=0.0)  # [BM, BK]
            wmask = k_ok[:, None] & n_ok[None, :]
            wg = tl.load(w + n[None, :] * stride_wn + kk[:, None], mask=wmask, other=0.0)
            wu = tl.load(w + (WIDTH + n)[None, :] * stride_wn + kk[:, None], mask=wmask,
                         other=0.0)
            gate += _dot(x, wg, F32_DOT)  # [BM, BN]
            up += _dot(x, wu, F32_DOT)
        act = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(ACT + slot[:, None] * stride_a + n[None, :], act.to(ACT.dtype.element_ty),
                 mask=ok[:, None] & n_ok[None, :])


@triton.jit
def _down(ACT, W, OUT, ORDER, B_EXPERT, B_START, B_END, H, WIDTH, stride_a, stride_we,
          stride_wn, stride_o, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          F32_DOT: tl.constexpr):
    """OUT[s, n] = act_s . down_e[n] for the block's slots s; W: [E, H, WIDTH]."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    e = tl.load(B_EXPERT + pid_m)
    if e >= 0:
        r = tl.load(B_START + pid_m) + tl.arange(0, BLOCK_M)
        ok = r < tl.load(B_END + pid_m)
        slot = tl.load(ORDER + r, mask=ok, other=0)
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < H
        w = W + e.to(tl.int64) * stride_we
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, WIDTH, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            k_ok = kk < WIDTH
            a = tl.load(ACT + slot[:, None] * stride_a + kk[None, :],
                        mask=ok[:, None] & k_ok[None, :], other=0.0)
            wd = tl.load(w + n[None, :] * stride_wn + kk[:, None],
                         mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc += _dot(a, wd, F32_DOT)
        tl.store(OUT + slot[:, None] * stride_o + n[None, :], acc.to(OUT.dtype.element_ty),
                 mask=ok[:, None] & n_ok[None, :])


def product(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, p: Plan) -> torch.Tensor:
    """x [T, H] -> each slot's expert output [T k, H] (unweighted; grouped.py weighs and sums)."""
    x, gate_up, down = x.contiguous(), gate_up.contiguous(), down.contiguous()
    T, H = x.shape
    WIDTH = down.shape[2]  # noqa: N806 (the kernels' name for it)
    S, B = T * p.top_k, p.block_expert.numel()
    act = torch.empty(S, WIDTH, device=x.device, dtype=x.dtype)
    out = torch.empty(S, H, device=x.device, dtype=x.dtype)
    f32 = INTERPRETED or x.dtype == torch.float32
    blocks = dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, F32_DOT=f32)
    _gate_up[(B, triton.cdiv(WIDTH, BLOCK_N))](
        x, gate_up, act, p.order, p.block_expert, p.block_start, p.block_end, p.top_k, H, WIDTH,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), act.stride(0), **blocks)
    _down[(B, triton.cdiv(H, BLOCK_N))](
        act, down, out, p.order, p.block_expert, p.block_start, p.block_end, H, WIDTH,
        act.stride(0), down.stride(0), down.stride(1), out.stride(0), **blocks)
    return out
