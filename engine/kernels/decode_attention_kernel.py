"""The Triton kernels of decode attention: a partial softmax per (KV head, split of the context,
block of query rows), then a combine per (KV head, query row), reading the paged arena in place
through the block table. attention/decode_attention.py holds the algorithm's description, its
PyTorch
reference and the choice of path; this module is imported only there, on a CUDA device where
Triton imports (CPU torch ships no Triton; tests run it in Triton's interpreter).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from engine.events import MAX_SPECULATIVE_TOKENS
from engine.kernels.decode_splits import num_splits

if TYPE_CHECKING:  # the cache sits above the kernels; its view is only a parameter type here
    from engine.cache.kv_cache import LayerKV

# Launch settings, for 16-bit and for quantized caches: keys per loop iteration (block_n),
# programs per SM (waves), warps, pipeline stages, query rows per tile for steps and verify
# blocks (block_m), table entries read at a time (chunk). Chosen by a sweep on the H200
# (`kv_attention_speed.py --sweep`; its figures are in BENCHMARKS.md):
# - Block ids read a chunk of 64 table entries at a time ("chunk", the scales with them): read
#   per tile inside the loop, they left Triton's pipelining one tile deep and exposed (a tile's
#   loads issued after computing the tile before, then waited on at once) and the scales loaded
#   synchronously, so an int8 cache read no faster than bf16 at twice the bytes.
# - 16-row tiles (mma.sync) for steps and verify blocks: a step has 4-7 query rows, and a
#   64-row tile (wgmma) holds 251 registers a thread, two programs an SM.
# - "fp16_dots" with "asm": int8 codes widened to fp16 by a byte permute and a paired fp16
#   subtraction in PTX (four codes a register; exact), e4m3 by its conversion to fp16, the dots
#   in fp16 (the query and probabilities round to fp16: finer than bf16, less range).
# - No loop pipelined by hand (each tile's loads issued while the one before is computed): it is
#   no faster than Triton's own pipelining over the chunk.
# Both: "consistent" steps and verify blocks (see decode_attention), splits placed by granules
# of 1,024 keys.
_SHARED = dict(consistent=True, granule=1024, block_m=16, chunk=64, waves=2, num_warps=4,
               num_stages=3)
CONFIGS = {False: dict(block_n=64, **_SHARED),
           True: dict(block_n=128, fp16_dots=True, asm=True, **_SHARED)}


@triton.jit
def _widen(x, dtype, F16: tl.constexpr, INT8: tl.constexpr, ASM: tl.constexpr):
    """Stored values -> the dot's dtype. int8 under F16: the bits of 1024 + (x + 128) as fp16
    (exponent 10: steps of 1 up to 2048), minus 1152, exact, with no conversion instruction;
    under ASM the same in PTX, four codes a register (a xor, two byte permutes, two paired fp16
    subtractions), where the compiler might otherwise widen one code at a time."""
    if F16 and INT8 and ASM:
        return tl.inline_asm_elementwise(
            asm="{ .reg .b32 u, h, c; xor.b32 u, $2, 0x80808080; mov.b32 h, 0x64646464; "
                "prmt.b32 $0, u, h, 0x4140; prmt.b32 $1, u, h, 0x4342; mov.b32 c, 0x64806480; "
                "sub.f16x2 $0, $0, c; sub.f16x2 $1, $1, c; }",
            constraints="=r,=r,r", args=[x], dtype=tl.float16, is_pure=True, pack=4)
    elif F16 and INT8:
        u = (x.to(tl.uint8, bitcast=True) ^ 0x80).to(tl.uint16)
        return (u | 0x6400).to(tl.uint16).to(tl.float16, bitcast=True) - 1152.0
    else:
        return x.to(dtype)


@triton.jit
def _load_tile(K, V, KS, VS, block, n, n_ok, head, stride_kb, stride_kh, stride_sb, stride_sh,
               d, d_ok, D: tl.constexpr, B: tl.constexpr, QUANTIZED: tl.constexpr):
    """The keys n ([BLOCK_N], of blocks `block`, their table entries) -> their K and V values as
    stored, [BLOCK_N, BLOCK_D], and their scales, [BLOCK_N] fp32 (zeros when not QUANTIZED)."""
    block = block.to(tl.int64)
    row = block * stride_kb + head * stride_kh + (n % B) * D  # [BLOCK_N]: K and V alike; a key's
    tile_ok = n_ok[:, None] & d_ok[None, :]  # D values stay contiguous
    k = tl.load(K + row[:, None] + d[None, :], mask=tile_ok, other=0.0)
    v = tl.load(V + row[:, None] + d[None, :], mask=tile_ok, other=0.0)
    if QUANTIZED:
        srow = block * stride_sb + head * stride_sh + n % B
        ks = tl.load(KS + srow, mask=n_ok, other=0.0).to(tl.float32)
        vs = tl.load(VS + srow, mask=n_ok, other=0.0).to(tl.float32)
    else:
        ks = tl.zeros(n.shape, tl.float32)
        vs = tl.zeros(n.shape, tl.float32)
    return k, v, ks, vs


@triton.jit
def _attend_tile(q, k, v, ks, vs, n, n_ok, pos, m_i, l_i, acc, scaling, QUANTIZED: tl.constexpr,
                 IEEE: tl.constexpr, F16: tl.constexpr, INT8: tl.constexpr, ASM: tl.constexpr):
    """One tile of keys into the running softmax of the rows: (m, l, acc) -> (m, l, acc)."""
    # int8 and e4m3 values are exact in bf16/fp16: upcast, multiply on tensor cores
    k = _widen(k, q.dtype, F16, INT8, ASM)
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")  # [BLOCK_M, BLOCK_N]
    else:
        s = tl.dot(q, tl.trans(k))
    if QUANTIZED:  # q . (k_q s_k) = s_k (q . k_q): one multiply per key, not per element
        s = s * ks[None, :]
    s = tl.where((n[None, :] <= pos[:, None]) & n_ok[None, :], s * scaling, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key seen yet: no NaN
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _widen(v, q.dtype, F16, INT8, ASM)
    if QUANTIZED:  # sum_n p_n s_n v_q,n: the V scale folds into the probabilities
        p = p * vs[None, :]
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v)
    return m_new, l_i, acc


# ROWS and T are plain arguments, not compile-time constants, and not specialized on: otherwise
# a chat's every new prefill length compiles the kernel again, which a draft catching up pays
# for in whole rounds; one compiled kernel serves steps and verify blocks of any length, one
# more prefill chunks (their 64-row tile).
# kv_len and n_splits neither (they only bound loops and masks): a prefill chunk's kv_len is
# not always a multiple of 16, which Triton would compile a second version for
@triton.jit(do_not_specialize=["kv_len", "n_splits", "ROWS", "T"])
def _partial(Q, K, V, KS, VS, TABLE, POS, PM, PL, PO, kv_len, n_splits, scaling, stride_kb,
             stride_kh, stride_sb, stride_sh, ROWS, T, D: tl.constexpr, B: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
             QUANTIZED: tl.constexpr, IEEE: tl.constexpr, GRANULE: tl.constexpr,
             F16: tl.constexpr, INT8: tl.constexpr, ASM: tl.constexpr, CHUNK: tl.constexpr):
    """Q: [H_kv, ROWS, D] (row g T + t); K, V: [num_blocks, H_kv, B, D] int8/fp8/16-bit; KS, VS:
    [num_blocks, H_kv, B] fp16 (QUANTIZED); TABLE: [max_blocks] int32, key n at block
    TABLE[n // B], slot n % B; POS: [T] int64 -> PM, PL: [H_kv, S, ROWS] fp32,
    PO: [H_kv, S, ROWS, D].
    CHUNK > 0: the table entries of CHUNK blocks at a time loaded ahead of the tiles that use them
    and handed to each tile by a gather in registers, so no load's address inside the tile loop
    comes from another load of it, and Triton can pipeline the K, V and scale loads as over a
    flat cache (CHUNK B a multiple of BLOCK_N: a tile never straddles two chunks)."""
    head = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < ROWS
    pos = tl.load(POS + rows % T, mask=row_ok, other=-1).to(tl.int32)  # [BLOCK_M]
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(Q + (head * ROWS + rows[:, None]) * D + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    if F16:
        q = q.to(tl.float16)
    # the keys these rows see end at their latest position (a device value: the graph of a
    # bucket serves every position below it); the splits share them evenly
    end = tl.minimum(kv_len, tl.max(pos, 0) + 1)
    if GRANULE > 0:  # split points from the end rounded up to GRANULE keys: a one-token step
        # and a verify block over the same positions split alike, unless the block crosses a
        # granule's edge (K of GRANULE rounds); splits past the end stay idle
        spread = tl.minimum(kv_len, tl.cdiv(end, GRANULE) * GRANULE)
    else:
        spread = end
    per_split = tl.cdiv(tl.cdiv(spread, n_splits), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, end)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CHUNK > 0:
        for first in range(lo, hi, CHUNK * B):
            last = tl.minimum(first + CHUNK * B, hi)
            pages = first // B + tl.arange(0, CHUNK)  # [CHUNK]
            blocks = tl.load(TABLE + pages, mask=pages * B < last, other=0)
            if QUANTIZED:  # the chunk's scales too: [CHUNK B]
                keys = first + tl.arange(0, CHUNK * B)
                kblock = tl.gather(blocks, (keys - first) // B, 0).to(tl.int64)
                srow = kblock * stride_sb + head * stride_sh + keys % B
                k_scales = tl.load(KS + srow, mask=keys < last, other=0.0).to(tl.float32)
                v_scales = tl.load(VS + srow, mask=keys < last, other=0.0).to(tl.float32)
            for start in range(first, last, BLOCK_N):
                n = start + tl.arange(0, BLOCK_N)
                # [BLOCK_N]: TABLE[n // B]. The modulo is the identity for this chunk's tiles;
                # Triton's pipelining also runs this line for the tiles past the loop's end (their
                # loads masked off), whose indices would fall outside the chunk: a gather out of
                # range read outside shared memory (an illegal address on the H200)
                block = tl.gather(blocks, (n - first) // B % CHUNK, 0)
                k, v, ks, vs = _load_tile(K, V, KS, VS, block, n, n < last, head, stride_kb,
                                          stride_kh, stride_sb, stride_sh, d, d_ok, D, B, False)
                if QUANTIZED:
                    ks = tl.gather(k_scales, (n - first) % (CHUNK * B), 0)
                    vs = tl.gather(v_scales, (n - first) % (CHUNK * B), 0)
                m_i, l_i, acc = _attend_tile(q, k, v, ks, vs, n, n < last, pos, m_i, l_i, acc,
                                             scaling, QUANTIZED, IEEE, F16, INT8, ASM)
    else:
        for start in range(lo, hi, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            block = tl.load(TABLE + n // B, mask=n < hi, other=0)  # each key through the table
            k, v, ks, vs = _load_tile(K, V, KS, VS, block, n, n < hi, head, stride_kb, stride_kh,
                                      stride_sb, stride_sh, d, d_ok, D, B, QUANTIZED)
            m_i, l_i, acc = _attend_tile(q, k, v, ks, vs, n, n < hi, pos, m_i, l_i, acc,
                                         scaling, QUANTIZED, IEEE, F16, INT8, ASM)
    at = (head * n_splits + split) * ROWS + rows  # [BLOCK_M]
    tl.store(PM + at, m_i, mask=row_ok)
    tl.store(PL + at, l_i, mask=row_ok)
    tl.store(PO + at[:, None] * D + d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=["ROWS"])
def _combine(PM, PL, PO, OUT, n_splits, ROWS, D: tl.constexpr,
             BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Merge one row's splits: out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s, M = max m_s.
    OUT: [H_kv, ROWS, D]; a split past the row's position has l = 0 and weighs nothing."""
    head = tl.program_id(0).to(tl.int64)
    row = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    s_ok = s < n_splits
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    at = (head * n_splits + s) * ROWS + row  # [BLOCK_S]
    m = tl.load(PM + at, mask=s_ok, other=float("-inf"))
    total = tl.load(PL + at, mask=s_ok, other=0.0)  # l_s
    w = tl.where(total > 0, tl.exp(m - tl.max(m, 0)), 0.0)
    o = tl.load(PO + at[:, None] * D + d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.sum(total * w, 0)
    tl.store(OUT + (head * ROWS + row) * D + d, out.to(OUT.dtype.element_ty), mask=d_ok)


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


INTERPRETER_SMS = 4  # Triton's CPU interpreter (tests): a few splits, as on a small GPU
MAX_BLOCK_TOKENS = MAX_SPECULATIVE_TOKENS + 1  # a pass of more query tokens is a prefill chunk,
# not a step or a verify block, and needs no split to agree with a step's


def decode_attention(q: torch.Tensor, kv: LayerKV, pos: torch.Tensor, kv_len: int,
                     scaling: float, config: dict | None = None) -> torch.Tensor:
    """q: [1, H, T, D], pos: [T] int64 -> [1, H, T, D] in q's dtype. Launches only: no host
    sync, and shapes depend on (T, kv_len) alone, so a CUDA graph captures it per bucket.
    `config` overrides CONFIGS (a session's Backends.launch: benchmark sweeps)."""
    _, H, T, D = q.shape
    Hkv, B = kv.k.shape[1], kv.k.shape[2]
    rows = H // Hkv * T
    quantized = kv.k_scale is not None
    cfg = {**CONFIGS[quantized], **(config or {})}
    # a 16-bit cache is read in its own dtype (as the SDPA path does); a quantized one upcasts
    # its values to the query's dtype inside the kernel
    qg = (q if quantized else q.to(kv.k.dtype)).reshape(Hkv, rows, D).contiguous()
    sms = _num_sms(q.device.index or 0) if q.device.type == "cuda" else INTERPRETER_SMS
    S = num_splits(kv_len, Hkv, sms, cfg["waves"])
    # "consistent": a query row's arithmetic the same whatever else shares its pass (a one-token
    # step or a verify block: one row tile size, split points from the end rounded up to a
    # granule). Without it, verify blocks move the logits of single steps and flip argmaxes,
    # which speculation pays for in rejected tokens (verify_consistency.py); with it, bit for
    # bit the same
    consistent = bool(cfg["consistent"])
    if not consistent:
        block_m = max(16, min(64, triton.next_power_of_2(rows)))
    elif T > MAX_BLOCK_TOKENS:  # a prefill chunk, whose rows fill 64-row tiles
        block_m = 64
    else:  # steps and verify blocks: one tile size (16 or 32: the tensor cores' mma.sync, whose
        # rows do not depend on one another; 64 on Hopper: wgmma, a whole warp group's rows)
        block_m = int(cfg["block_m"])
    if T > MAX_BLOCK_TOKENS:  # a prefill chunk: its row tiles fill the GPU, splits would only
        S = max(1, S // triton.cdiv(rows, block_m))  # add partial results ([H_kv, S, rows, D])
    chunk = int(cfg.get("chunk", 0))  # table entries a gather serves; off where a tile would
    if chunk and (chunk * B) % cfg["block_n"]:  # straddle two chunks
        chunk = 0
    part_m = torch.empty((Hkv, S, rows), dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_o = torch.empty((Hkv, S, rows, D), dtype=torch.float32, device=q.device)
    out = torch.empty((Hkv, rows, D), dtype=qg.dtype, device=q.device)
    block_d = max(16, triton.next_power_of_2(D))
    ks = kv.k_scale if quantized else kv.k  # unread when not QUANTIZED: any pointer will do
    vs = kv.v_scale if quantized else kv.v
    _partial[(Hkv, S, triton.cdiv(rows, block_m))](
        qg, kv.k, kv.v, ks, vs, kv.table, pos, part_m, part_l, part_o, kv_len, S, float(scaling),
        kv.k.stride(0), kv.k.stride(1), ks.stride(0), ks.stride(1),
        ROWS=rows, T=T, D=D, B=B, BLOCK_M=block_m, BLOCK_N=cfg["block_n"], BLOCK_D=block_d,
        QUANTIZED=quantized, IEEE=qg.dtype == torch.float32,
        GRANULE=int(cfg["granule"]) if consistent else 0,
        F16=bool(quantized and cfg.get("fp16_dots") and qg.dtype != torch.float32),
        INT8=kv.k.dtype == torch.int8,
        ASM=bool(cfg.get("asm")) and q.device.type == "cuda",  # PTX: not in the interpreter
        CHUNK=chunk, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    _combine[(Hkv, rows)](part_m, part_l, part_o, out, S, ROWS=rows, D=D,
                          BLOCK_S=max(2, triton.next_power_of_2(S)), BLOCK_D=block_d,
                          num_warps=4)
    return out.view(1, H, T, D).to(q.dtype)  # [H_kv, G, T, D]: head h_kv G + g
