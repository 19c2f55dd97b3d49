"""The small pieces between a decode step's linear layers, one Triton launch each: the residual
add with the RMSNorm after it, the RMSNorm alone, SiLU(gate) * up, and the split of the fused
q/k/v projection with Qwen3's head norms, RoPE on q and k, and the K/V stores into the block
arena (kernels/kv_write_kernel.py quantizes them, for an int8/fp8 cache, in two more launches).

In PyTorch ops (layers.FamilyStep) an RMSNorm is eight kernels (the fp32 copy, square, mean,
epsilon, rsqrt, product, cast back, weight) and SiLU * up two; a Llama/Qwen layer runs two norms
and one MLP, about 18 small kernels a layer that each cost a few microseconds of a captured step
whatever their size (a share of the step that does not scale with the weights); RoPE on q and k and
the two indexed stores are about 20 more. torch.compile fuses them too (`--compile`), at seconds of
load time.

The rounding is PyTorch's, step for step: the sum in the input dtype, the norm in fp32 and cast
back before the weight's product in the input dtype, SiLU rounded before its product; only the
order of the mean's additions differs. One program per row of the hidden size, which fits one
tile (up to 16K columns). Imported only where Triton runs (CUDA, or TRITON_INTERPRET=1 in tests).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from engine.kernels import kv_quant, kv_write_kernel
from engine.kernels.int4_gemv_kernel import GEMV_MAX_ROWS
from engine.platform.nvrtc import pdl_mode, pdl_wanted

try:  # Triton 3.4 on: grid dependency control (Hopper's programmatic dependent launch)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass

MAX_COLUMNS = 16384  # one row in one tile: Llama-3-70B's 8,192 and some headroom


@functools.cache
def _triton_pdl() -> bool:
    from triton.backends.nvidia.compiler import CUDAOptions

    return "launch_pdl" in CUDAOptions.__dataclass_fields__


def pdl_options(device: torch.device, tokens: int) -> dict:
    """A Triton piece's launch options around the int4 decode products (platform/nvrtc.py):
    PDL, whether it lets the next kernel start at once (gdc_launch_dependents: a product's
    blocks then start while this piece runs) and waits for its inputs (gdc_wait, a no-op unless
    it was itself launched as a dependent); launch_pdl, whether it is: HEARTH_PDL=auto, a Triton
    that has the option, and a step of at most GEMV_MAX_ROWS tokens, whose products are the gemv's
    (in a batch of 16, pieces launched so cost 5-9% of its tokens/s). Off the GPU (the interpreter's
    tensors too), neither."""
    if device.type != "cuda":
        return _OFF
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _pdl_options(index, pdl_mode(), tokens <= GEMV_MAX_ROWS)


_OFF = dict(PDL=False)


@functools.cache
def _pdl_options(index: int, mode: str, few: bool) -> dict:
    if not pdl_wanted(index):
        return _OFF
    on = mode == "auto" and few and _triton_pdl()
    return dict(PDL=True, launch_pdl=True) if on else dict(PDL=True)


@triton.jit
def _add_rms(X, DELTA, W, SUM, OUT, eps, N: tl.constexpr, BLOCK: tl.constexpr,
             HAS_DELTA: tl.constexpr, PDL: tl.constexpr):
    """Row r of X [R, N] (+ DELTA [R, N] -> SUM): OUT = W * (x * rsqrt(mean(x^2) + eps))."""
    if PDL:  # (pdl_options)
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(X + row * N + cols, mask=ok, other=0.0)
    if HAS_DELTA:  # rounded to the input dtype, as x + delta is in PyTorch
        x = (x.to(tl.float32) + tl.load(DELTA + row * N + cols, mask=ok, other=0.0)
             .to(tl.float32)).to(X.dtype.element_ty)
        tl.store(SUM + row * N + cols, x, mask=ok)
    x32 = x.to(tl.float32)
    r = tl.math.rsqrt(tl.sum(x32 * x32, 0) / N + eps)
    y = (x32 * r).to(X.dtype.element_ty).to(tl.float32)  # cast back, then the weight's product
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + row * N + cols, (w * y).to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul(GU, OUT, N: tl.constexpr, BLOCK: tl.constexpr):
    """Row r of GU [R, 2N] = [gate, up] -> OUT [R, N] = SiLU(gate) * up, SiLU rounded first."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    g = tl.load(GU + row * 2 * N + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(GU + row * 2 * N + N + cols, mask=ok, other=0.0).to(tl.float32)
    # e^-g as 2^(-g log2 e): one ex2.approx, which kernels/int4_gemv_kernel.py's fused SiLU *
    # up repeats for the same bits (tl.exp's lowering is Triton's choice)
    e = tl.math.exp2(-g * 1.4426950408889634)
    silu = tl.math.div_rn(g, 1.0 + e).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * N + cols, (silu * u).to(OUT.dtype.element_ty), mask=ok)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _launch_rms(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    N = x.shape[-1]
    xr = _rows(x.contiguous())
    out = torch.empty_like(xr, dtype=torch.promote_types(w.dtype, x.dtype))
    total = torch.empty_like(xr) if delta is not None else xr
    dr = _rows(delta.contiguous()) if delta is not None else xr
    block = triton.next_power_of_2(N)
    _add_rms[(xr.shape[0],)](xr, dr, w, total, out, float(eps), N=N, BLOCK=block,
                             HAS_DELTA=delta is not None, num_warps=8 if block >= 4096 else 4,
                             **pdl_options(x.device, xr.shape[0]))
    return total.view(x.shape), out.view(x.shape)


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [..., N] -> w * RMSNorm(x), as FamilyStep.rms."""
    return _launch_rms(x, None, w, eps)[1]


def add_rms(x: torch.Tensor, delta: torch.Tensor, w: torch.Tensor,
            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (x + delta, w * RMSNorm(x + delta)), as FamilyStep.add_rms."""
    return _launch_rms(x, delta, w, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2N] = [gate, up] -> [..., N] = SiLU(gate) * up, as FamilyStep.silu_mul."""
    N = gate_up.shape[-1] // 2
    gu = _rows(gate_up.contiguous())
    out = torch.empty((gu.shape[0], N), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(N))
    _silu_mul[(gu.shape[0], triton.cdiv(N, block))](gu, out, N=N, BLOCK=block, num_warps=4)
    return out.view(*gate_up.shape[:-1], N)


@triton.jit
def _qkv_rope(QKV, COS, SIN, QN, KN, Q, K, V, TABLE, POS, eps, stride_kb, stride_kh, T,
              table_stride, H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, B: tl.constexpr,
              BLOCK_D: tl.constexpr, HAS_NORM: tl.constexpr, TO_CACHE: tl.constexpr,
              PDL: tl.constexpr):
    """Program (t, j): head j of token t in QKV [T, (H + 2 HKV) D]: j < H a query head, then the
    key heads, then the value heads. q and k: RMSNorm over the head (HAS_NORM, Qwen3), then
    x cos + rotate_half(x) sin (COS, SIN: [T, D]), each product rounded as PyTorch rounds it;
    q to Q [1, H, T, D]; k and v to the arena K, V [blocks, HKV, B, D] at block TABLE[p // B]
    (TABLE[t, p // B] with table_stride > 0: token t of sequence t, a batched step), slot p % B
    (TO_CACHE), else to K, V [T, HKV, D] for the quantizing store."""
    if PDL:  # (pdl_options)
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    dt = Q.dtype.element_ty
    row = QKV + (t * (H + 2 * HKV) + j) * D
    x = tl.load(row + d, mask=ok, other=0.0)
    if j < H + HKV:
        partner = (d + D // 2) % D
        xp = tl.load(row + partner, mask=ok, other=0.0)
        if HAS_NORM:  # as FamilyStep.rms over the head: fp32, cast back, then the weight
            x32, xp32 = x.to(tl.float32), xp.to(tl.float32)
            r = tl.math.rsqrt(tl.sum(x32 * x32, 0) / D + eps)
            is_q = j < H  # both weights loaded, one kept: D values each
            w = tl.where(is_q, tl.load(QN + d, mask=ok, other=0.0),
                         tl.load(KN + d, mask=ok, other=0.0)).to(tl.float32)
            wp = tl.where(is_q, tl.load(QN + partner, mask=ok, other=0.0),
                          tl.load(KN + partner, mask=ok, other=0.0)).to(tl.float32)
            x = (w * (x32 * r).to(dt).to(tl.float32)).to(dt)
            xp = (wp * (xp32 * r).to(dt).to(tl.float32)).to(dt)
        c = tl.load(COS + t * D + d, mask=ok, other=0.0).to(tl.float32)
        sn = tl.load(SIN + t * D + d, mask=ok, other=0.0).to(tl.float32)
        rot = tl.where(d < D // 2, -xp.to(tl.float32), xp.to(tl.float32))
        x = ((x.to(tl.float32) * c).to(dt).to(tl.float32)
             + (rot * sn).to(dt).to(tl.float32)).to(dt)
    if j < H:
        tl.store(Q + (j * T + t) * D + d, x, mask=ok)
    else:
        is_k = j < H + HKV
        head = tl.where(is_k, j - H, j - H - HKV).to(tl.int64)
        if TO_CACHE:
            p = tl.load(POS + t)
            at = (tl.load(TABLE + t * table_stride + p // B).to(tl.int64) * stride_kb
                  + head * stride_kh
                  + (p % B) * D)
        else:
            at = (t * HKV + head) * D
        if is_k:
            tl.store(K + at + d, x.to(K.dtype.element_ty), mask=ok)
        else:
            tl.store(V + at + d, x.to(V.dtype.element_ty), mask=ok)


def qkv_rope(qkv: torch.Tensor, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
             cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
             table: torch.Tensor, *, num_heads: int, num_kv_heads: int, eps: float,
             rotation: torch.Tensor | None = None) -> torch.Tensor:
    """As FamilyStep.qkv_rope: qkv [1, T, (H + 2 H_kv) D] -> q [1, H, T, D], these tokens' K/V
    written at pos [T] through `table` ([max_blocks], or [>= T, max_blocks]: a row per token)
    into the arena (quantized there for int8/fp8, keys and queries first rotated by
    `rotation`, the cache's key_rotation [D, D] fp32)."""
    T = qkv.shape[1]
    H, Hkv = num_heads, num_kv_heads
    D = qkv.shape[-1] // (H + 2 * Hkv)
    q = torch.empty((1, H, T, D), dtype=qkv.dtype, device=qkv.device)
    to_cache = k_scale is None
    if to_cache:
        k_out, v_out = k_cache, v_cache
    else:  # rotated K and V first, then quantized into the arena
        k_out = torch.empty((T, Hkv, D), dtype=qkv.dtype, device=qkv.device)
        v_out = torch.empty_like(k_out)
    qkv = qkv.contiguous()
    _qkv_rope[(T, H + 2 * Hkv)](
        qkv, cos.contiguous(), sin.contiguous(), qkv if q_norm is None else q_norm,
        qkv if k_norm is None else k_norm, q, k_out, v_out, table, pos, float(eps),
        k_cache.stride(0), k_cache.stride(1), T, table.stride(0) if table.dim() == 2 else 0,
        H=H, HKV=Hkv, D=D, B=k_cache.shape[2],
        BLOCK_D=triton.next_power_of_2(D), HAS_NORM=q_norm is not None, TO_CACHE=to_cache,
        num_warps=1 if D <= 128 else 2, **pdl_options(qkv.device, T))
    if not to_cache:
        if rotation is not None:  # rotated keys, read by rotated queries: in fp32
            q, k_out = kv_quant.rotate(q, rotation).to(q.dtype), kv_quant.rotate(k_out, rotation)
        kv_write_kernel.quantize_store(k_cache, k_scale, table, pos, k_out)
        kv_write_kernel.quantize_store(v_cache, v_scale, table, pos, v_out)
    return q
