"""The grouped expert product in Triton (the reference: grouped.py): two launches over the
plan's blocks, each block BLOCK_M slots of one expert. The first reads that expert's [gate; up]
rows and writes SiLU(gate) * up per slot; the second reads its down rows and writes each slot's
output. A block of expert -1 returns before reading anything: only routed experts are read.
Weights are 16-bit [E, N, K] tensors or 4-bit ones (packed.py), dequantized tile by tile in
registers: codes shifted out of their int32 word, times the group's scale, plus its offset
(AWQ's round-to-nearest) or through NF4's 16-entry table.

Imported only where Triton imports (CUDA, or TRITON_INTERPRET=1 in tests).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from engine.kernels.experts.grouped import BLOCK_M, Plan
from engine.kernels.experts.packed import Packed4, code_values

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK_N, BLOCK_K = 32, 32


@triton.jit
def _dot(a, b, F32_DOT: tl.constexpr):
    if F32_DOT:  # fp32 weights, and Triton's CPU interpreter (it multiplies bf16 wrongly)
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b.to(a.dtype))  # 16-bit operands on the tensor cores, fp32 accumulation


@triton.jit
def _tile(W, SCALE, OFFSET, TABLE, e, n, kk, mask, stride_we, stride_wn, stride_se,
          stride_sg, G, FOUR_BIT: tl.constexpr, CODEBOOK: tl.constexpr):
    """Expert e's weights [BK, BN] at input features kk of rows n (0 outside `mask`): read as
    they are, or 4-bit codes dequantized here (packed.py's formula, in fp32). One return at the
    end: the compiler visits the statements after a return inside a constexpr branch, and the
    4-bit code's shifts do not compile over a 16-bit pointer."""
    if FOUR_BIT:
        words = tl.load(W + e * stride_we + n[None, :] * stride_wn + (kk // 8)[:, None],
                        mask=mask, other=0)  # eight codes a word: each word read for its 8
        q = (words >> ((kk % 8) * 4)[:, None]) & 0xF
        at = e * stride_se + (kk // G)[:, None] * stride_sg + n[None, :]
        s = tl.load(SCALE + at, mask=mask, other=0.0).to(tl.float32)
        if CODEBOOK:
            w = tl.load(TABLE + q) * s
        else:
            offset = tl.load(OFFSET + at, mask=mask, other=0.0).to(tl.float32)
            w = (q - 8).to(tl.float32) * s + offset
    else:
        w = tl.load(W + e * stride_we + n[None, :] * stride_wn + kk[:, None], mask=mask,
                    other=0.0)
    return w


@triton.jit
def _gate_up(X, ACT, ORDER, B_EXPERT, B_START, B_END, TOP_K, H, WIDTH, stride_x, stride_a,
             W, SCALE, OFFSET, TABLE, G, stride_we, stride_wn, stride_se, stride_sg,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             F32_DOT: tl.constexpr, FOUR_BIT: tl.constexpr, CODEBOOK: tl.constexpr):
    """ACT[s, n] = SiLU(x_t . gate_e[n]) * (x_t . up_e[n]) for the block's slots s (token
    t = s // TOP_K) and columns n of this program; W: [E, 2 WIDTH, H] (WIDTH: an expert's
    intermediate size), or its 4-bit codes [E, 2 WIDTH, H / 8] with SCALE and OFFSET."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    e = tl.load(B_EXPERT + pid_m)
    if e >= 0:
        e64 = e.to(tl.int64)  # a new name: Triton keeps one type per name across the if
        r = tl.load(B_START + pid_m) + tl.arange(0, BLOCK_M)
        ok = r < tl.load(B_END + pid_m)
        slot = tl.load(ORDER + r, mask=ok, other=0)
        token = slot // TOP_K
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < WIDTH
        gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, H, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            k_ok = kk < H
            x = tl.load(X + token[:, None] * stride_x + kk[None, :],
                        mask=ok[:, None] & k_ok[None, :], other=0.0)  # [BM, BK]
            wmask = k_ok[:, None] & n_ok[None, :]
            wg = _tile(W, SCALE, OFFSET, TABLE, e64, n, kk, wmask, stride_we, stride_wn,
                       stride_se, stride_sg, G, FOUR_BIT, CODEBOOK)
            wu = _tile(W, SCALE, OFFSET, TABLE, e64, WIDTH + n, kk, wmask, stride_we, stride_wn,
                       stride_se, stride_sg, G, FOUR_BIT, CODEBOOK)
            gate += _dot(x, wg, F32_DOT)  # [BM, BN]
            up += _dot(x, wu, F32_DOT)
        act = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(ACT + slot[:, None] * stride_a + n[None, :], act.to(ACT.dtype.element_ty),
                 mask=ok[:, None] & n_ok[None, :])


@triton.jit
def _down(ACT, OUT, ORDER, B_EXPERT, B_START, B_END, H, WIDTH, stride_a, stride_o,
          W, SCALE, OFFSET, TABLE, G, stride_we, stride_wn, stride_se, stride_sg,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          F32_DOT: tl.constexpr, FOUR_BIT: tl.constexpr, CODEBOOK: tl.constexpr):
    """OUT[s, n] = act_s . down_e[n] for the block's slots s; W: [E, H, WIDTH] (or its codes)."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    e = tl.load(B_EXPERT + pid_m)
    if e >= 0:
        e64 = e.to(tl.int64)  # a new name: Triton keeps one type per name across the if
        r = tl.load(B_START + pid_m) + tl.arange(0, BLOCK_M)
        ok = r < tl.load(B_END + pid_m)
        slot = tl.load(ORDER + r, mask=ok, other=0)
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < H
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, WIDTH, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            k_ok = kk < WIDTH
            a = tl.load(ACT + slot[:, None] * stride_a + kk[None, :],
                        mask=ok[:, None] & k_ok[None, :], other=0.0)
            wd = _tile(W, SCALE, OFFSET, TABLE, e64, n, kk, k_ok[:, None] & n_ok[None, :],
                       stride_we, stride_wn, stride_se, stride_sg, G, FOUR_BIT, CODEBOOK)
            acc += _dot(a, wd, F32_DOT)
        tl.store(OUT + slot[:, None] * stride_o + n[None, :], acc.to(OUT.dtype.element_ty),
                 mask=ok[:, None] & n_ok[None, :])


def _operands(w) -> tuple:
    """A projection's kernel arguments (W, SCALE, OFFSET, TABLE, G, W's strides, SCALE's) and
    constexprs; a 16-bit tensor passes itself where the scales would go (never read)."""
    if not isinstance(w, Packed4):
        w = w.contiguous()
        return (w, w, w, w, 1, w.stride(0), w.stride(1), 0, 0), dict(FOUR_BIT=False,
                                                                    CODEBOOK=False)
    packed, scales = w.packed.contiguous(), w.scales.contiguous()
    offsets = scales if w.offsets is None else w.offsets.contiguous()
    table = code_values(w.codebook, w.device)
    return ((packed, scales, offsets, table, w.group_size, packed.stride(0), packed.stride(1),
             scales.stride(0), scales.stride(1)), dict(FOUR_BIT=True, CODEBOOK=w.codebook))


def product(x: torch.Tensor, gate_up, down, p: Plan) -> torch.Tensor:
    """x [T, H] -> each slot's expert output [T k, H] (unweighted; grouped.py weighs and sums).
    gate_up and down: 16-bit tensors or packed.Packed4, the two of one kind."""
    x = x.contiguous()
    T, H = x.shape
    WIDTH = down.shape[2]  # noqa: N806 (the kernels' name for it)
    S, B = T * p.top_k, p.block_expert.numel()
    act = torch.empty(S, WIDTH, device=x.device, dtype=x.dtype)
    out = torch.empty(S, H, device=x.device, dtype=x.dtype)
    f32 = INTERPRETED or x.dtype == torch.float32
    blocks = dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, F32_DOT=f32)
    gu, gu_kind = _operands(gate_up)
    dn, dn_kind = _operands(down)
    _gate_up[(B, triton.cdiv(WIDTH, BLOCK_N))](
        x, act, p.order, p.block_expert, p.block_start, p.block_end, p.top_k, H, WIDTH,
        x.stride(0), act.stride(0), *gu, **blocks, **gu_kind)
    _down[(B, triton.cdiv(H, BLOCK_N))](
        act, out, p.order, p.block_expert, p.block_start, p.block_end, H, WIDTH, act.stride(0),
        out.stride(0), *dn, **blocks, **dn_kind)
    return out
