"""Quantize-on-write in one Triton launch: K (or V) of T new tokens, every KV head.

kv_arena.store does the same in PyTorch ops: about a dozen small kernels for K and again for V,
in every layer of every decode step, costing a captured step far more than the bytes they move
(an int8 cache decoded slower than a bf16 one: docs/benchmark-log.md). Here one program quantizes
one (token, head) vector of D values and stores its codes and its fp16 scales (one per group of
D / NG elements, kernels/kv_quant.py): two launches a layer, for K and for V.

Bit for bit the rounding of kv_quant.quantize: the scale rounded to fp16 first, an IEEE division
(div_rn, not Triton's default approximate one), int8 rounded half to even (the 1.5 * 2^23 trick:
exact in fp32 for |y| < 2^22), fp8 by the hardware's round-to-nearest-even conversion.

Where the values live is a parameter: a block table and a block size address position p at block
table[p // B], slot p % B; the contiguous cache is one block of its whole length. Imported only
where Triton runs (CUDA, or TRITON_INTERPRET=1 in tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels import kv_quant


@triton.jit
def _quantize_store(X, POS, TABLE, OUT, OS, stride_xt, stride_xh, stride_ob, stride_oh,
                    stride_os, stride_sb, stride_sh, block_size, H, qmax, scale_min, scale_max,
                    table_stride, NG: tl.constexpr, G: tl.constexpr, BLOCK_NG: tl.constexpr,
                    BLOCK_G: tl.constexpr, IS_INT8: tl.constexpr, HAS_TABLE: tl.constexpr):
    """X: [T, H, NG G] by strides; POS: [T] int64; TABLE: [blocks] int32, or [T, blocks] with
    table_stride > 0 (token t of sequence t: a batched step) (HAS_TABLE; else one block); OUT:
    [blocks, H, B, NG G] int8 or fp8 e4m3 by strides; OS: [blocks, H, B, NG] fp16, one scale per
    group of G elements. Program t * H + h: its vector as a [NG, G] tile, a row per group."""
    th = tl.program_id(0)
    t, h = (th // H).to(tl.int64), (th % H).to(tl.int64)
    g = tl.arange(0, BLOCK_NG)
    d = g[:, None] * G + tl.arange(0, BLOCK_G)[None, :]  # [BLOCK_NG, BLOCK_G]
    ok = (g < NG)[:, None] & (tl.arange(0, BLOCK_G) < G)[None, :]
    x = tl.load(X + t * stride_xt + h * stride_xh + d, mask=ok, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), 1)  # [BLOCK_NG]
    scale = tl.minimum(tl.maximum(tl.math.div_rn(amax, qmax), scale_min), scale_max)
    scale = scale.to(tl.float16)
    y = tl.math.div_rn(x, scale.to(tl.float32)[:, None])
    y = tl.minimum(tl.maximum(y, -qmax), qmax)
    if IS_INT8:
        y = (y + 12582912.0) - 12582912.0  # 1.5 * 2^23: nearest, ties to even, as torch.round
        code = y.to(tl.int8)
    else:
        code = y.to(tl.float8e4nv, fp_downcast_rounding="rtne")  # as torch's cast
    p = tl.load(POS + t)
    if HAS_TABLE:
        block = tl.load(TABLE + t * table_stride + p // block_size).to(tl.int64)
        slot = p % block_size
    else:
        block = 0
        slot = p
    tl.store(OUT + block * stride_ob + h * stride_oh + slot * stride_os + d, code, mask=ok)
    tl.store(OS + block * stride_sb + h * stride_sh + slot * NG + g, scale, mask=g < NG)


def quantize_store(values: torch.Tensor, scales: torch.Tensor, table: torch.Tensor | None,
                   positions: torch.Tensor, x: torch.Tensor) -> None:
    """Quantize x ([T, H_kv, D], any strides with a dense last dim) into `values`
    [blocks, H_kv, B, D] int8/fp8 (dense last dim) and `scales` [blocks, H_kv, B, NG] fp16
    (dense over B and NG) at `positions` ([T] int64) through `table` ([>= max position // B + 1]
    int32; [T, ...]: one row per token, a batched step), or with no table into block 0 at
    slot = position (the contiguous cache): one launch."""
    T, H, D = x.shape
    NG = scales.shape[3]
    assert x.stride(2) == 1 and values.stride(3) == 1
    assert scales.stride(3) == 1 and scales.stride(2) == NG
    _quantize_store[(T * H,)](
        x, positions, positions if table is None else table,  # (no table: any pointer)
        values, scales, x.stride(0), x.stride(1), values.stride(0), values.stride(1),
        values.stride(2), scales.stride(0), scales.stride(1),
        block_size=values.shape[2], H=H, qmax=kv_quant.QMAX[values.dtype],
        scale_min=kv_quant.SCALE_MIN, scale_max=kv_quant.SCALE_MAX,
        table_stride=table.stride(0) if table is not None and table.dim() == 2 else 0, NG=NG,
        G=D // NG, BLOCK_NG=triton.next_power_of_2(NG), BLOCK_G=triton.next_power_of_2(D // NG),
        IS_INT8=values.dtype == torch.int8, HAS_TABLE=table is not None)
