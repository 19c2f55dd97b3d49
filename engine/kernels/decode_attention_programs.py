"""The Triton programs of decode attention (kernels/decode_attention_kernel.py launches them):
a partial softmax per (KV head, split of the context, block of query rows), one sequence or a
batch of sequences each through its own block table, then a combine per (KV head, query row),
reading the paged arena in place. Imported only where Triton imports (a CUDA device, or its CPU
interpreter in tests)."""

from __future__ import annotations

import triton
import triton.language as tl

from engine.kernels.fused_ops_kernel import gdc_launch_dependents, gdc_wait


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
               d, d_ok, D: tl.constexpr, B: tl.constexpr, QUANTIZED: tl.constexpr,
               NG: tl.constexpr, G: tl.constexpr):
    """The keys n ([BLOCK_N], of blocks `block`, their table entries) -> their K and V values as
    stored, [BLOCK_N, BLOCK_D], and their scales, fp32: [BLOCK_N] (NG = 1: one a key), or
    [BLOCK_N, BLOCK_D] (NG groups of G elements: each element's group's); zeros when not
    QUANTIZED."""
    block = block.to(tl.int64)
    row = block * stride_kb + head * stride_kh + (n % B) * D  # [BLOCK_N]: K and V alike; a key's
    tile_ok = n_ok[:, None] & d_ok[None, :]  # D values stay contiguous
    k = tl.load(K + row[:, None] + d[None, :], mask=tile_ok, other=0.0)
    v = tl.load(V + row[:, None] + d[None, :], mask=tile_ok, other=0.0)
    if QUANTIZED and NG > 1:
        srow = block * stride_sb + head * stride_sh + (n % B) * NG
        at = srow[:, None] + (d // G)[None, :]
        ks = tl.load(KS + at, mask=tile_ok, other=0.0).to(tl.float32)
        vs = tl.load(VS + at, mask=tile_ok, other=0.0).to(tl.float32)
    elif QUANTIZED:
        srow = block * stride_sb + head * stride_sh + n % B
        ks = tl.load(KS + srow, mask=n_ok, other=0.0).to(tl.float32)
        vs = tl.load(VS + srow, mask=n_ok, other=0.0).to(tl.float32)
    else:
        ks = tl.zeros(n.shape, tl.float32)
        vs = tl.zeros(n.shape, tl.float32)
    return k, v, ks, vs


@triton.jit
def _attend_tile(q, k, v, ks, vs, n, n_ok, pos, m_i, l_i, acc, scaling, QUANTIZED: tl.constexpr,
                 IEEE: tl.constexpr, F16: tl.constexpr, INT8: tl.constexpr, ASM: tl.constexpr,
                 NG: tl.constexpr):
    """One tile of keys into the running softmax of the rows: (m, l, acc) -> (m, l, acc)."""
    # int8 and e4m3 values are exact in bf16/fp16: upcast, multiply on tensor cores
    k = _widen(k, q.dtype, F16, INT8, ASM)
    if QUANTIZED and NG > 1:  # a scale per group of a key's elements: dequantized before the
        k = (k.to(tl.float32) * ks).to(q.dtype)  # dot, rounded once to the query's dtype
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")  # [BLOCK_M, BLOCK_N]
    else:
        s = tl.dot(q, tl.trans(k))
    if QUANTIZED and NG == 1:  # q . (k_q s_k) = s_k (q . k_q): one multiply per key
        s = s * ks[None, :]
    s = tl.where((n[None, :] <= pos[:, None]) & n_ok[None, :], s * scaling, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key seen yet: no NaN
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _widen(v, q.dtype, F16, INT8, ASM)
    if QUANTIZED and NG > 1:
        v = (v.to(tl.float32) * vs).to(q.dtype)
    elif QUANTIZED:  # sum_n p_n s_n v_q,n: the V scale folds into the probabilities
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
@triton.jit(do_not_specialize=["kv_len", "n_splits", "ROWS", "T", "SEQS", "SEQ_TILES",
                               "TABLE_STRIDE"])
def partial_softmax(Q, K, V, KS, VS, TABLE, POS, LENS, SPLITS, PM, PL, PO, kv_len, n_splits,
                    scaling, stride_kb, stride_kh, stride_sb, stride_sh, ROWS, T, SEQS,
                    SEQ_TILES, TABLE_STRIDE, D: tl.constexpr, B: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    QUANTIZED: tl.constexpr, NG: tl.constexpr, G: tl.constexpr,
                    IEEE: tl.constexpr, GRANULE: tl.constexpr,
                    F16: tl.constexpr, INT8: tl.constexpr, ASM: tl.constexpr,
                    CHUNK: tl.constexpr, BATCHED: tl.constexpr, PDL: tl.constexpr):
    """Q: [H_kv, SEQS, ROWS, D] (row g T + t of each sequence); K, V: [num_blocks, H_kv, B, D]
    int8/fp8/16-bit; KS, VS: [num_blocks, H_kv, B, NG] fp16 (QUANTIZED; element d of a key
    scaled by its group d // G's); TABLE: [SEQS, TABLE_STRIDE]
    int32, key n of sequence s at block TABLE[s, n // B], slot n % B; POS: [SEQS, T] int64 ->
    PM, PL: [H_kv, S, SEQS ROWS] fp32, PO: [H_kv, S, SEQS ROWS, D].
    BATCHED: SEQS sequences in one launch (a batched decode step, T = 1), program axis 2 over
    (sequence, row tile); each sequence reads its own bucket LENS[s] and split count SPLITS[s]
    (<= n_splits, the layout's), so its rows compute what a launch of that sequence alone
    computes, bit for bit. Otherwise one sequence: kv_len and n_splits are its own.
    CHUNK > 0: the table entries of CHUNK blocks at a time loaded ahead of the tiles that use them
    and handed to each tile by a gather in registers, so no load's address inside the tile loop
    comes from another load of it, and Triton can pipeline the K, V and scale loads as over a
    flat cache (CHUNK B a multiple of BLOCK_N: a tile never straddles two chunks).
    PDL: fused_ops_kernel.pdl_options."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    head = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    layout_splits = n_splits
    if BATCHED:
        seq = (tl.program_id(2) // SEQ_TILES).to(tl.int64)
        rows = (tl.program_id(2) % SEQ_TILES) * BLOCK_M + tl.arange(0, BLOCK_M)
        kv_len = tl.load(LENS + seq)
        n_splits = tl.load(SPLITS + seq)
        TABLE += seq * TABLE_STRIDE
        POS += seq * T
    else:
        seq = 0
        rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < ROWS
    pos = tl.load(POS + rows % T, mask=row_ok, other=-1).to(tl.int32)  # [BLOCK_M]
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(Q + ((head * SEQS + seq) * ROWS + rows[:, None]) * D + d[None, :],
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
            if QUANTIZED and NG == 1:  # the chunk's scales too: [CHUNK B]
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
                # range reads outside shared memory (an illegal address)
                block = tl.gather(blocks, (n - first) // B % CHUNK, 0)
                k, v, ks, vs = _load_tile(K, V, KS, VS, block, n, n < last, head, stride_kb,
                                          stride_kh, stride_sb, stride_sh, d, d_ok, D, B,
                                          QUANTIZED and NG > 1, NG, G)
                if QUANTIZED and NG == 1:
                    ks = tl.gather(k_scales, (n - first) % (CHUNK * B), 0)
                    vs = tl.gather(v_scales, (n - first) % (CHUNK * B), 0)
                m_i, l_i, acc = _attend_tile(q, k, v, ks, vs, n, n < last, pos, m_i, l_i, acc,
                                             scaling, QUANTIZED, IEEE, F16, INT8, ASM, NG)
    else:
        for start in range(lo, hi, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            block = tl.load(TABLE + n // B, mask=n < hi, other=0)  # each key through the table
            k, v, ks, vs = _load_tile(K, V, KS, VS, block, n, n < hi, head, stride_kb, stride_kh,
                                      stride_sb, stride_sh, d, d_ok, D, B, QUANTIZED, NG, G)
            m_i, l_i, acc = _attend_tile(q, k, v, ks, vs, n, n < hi, pos, m_i, l_i, acc,
                                         scaling, QUANTIZED, IEEE, F16, INT8, ASM, NG)
    at = (head * layout_splits + split) * (SEQS * ROWS) + seq * ROWS + rows  # [BLOCK_M]
    tl.store(PM + at, m_i, mask=row_ok)
    tl.store(PL + at, l_i, mask=row_ok)
    tl.store(PO + at[:, None] * D + d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=["ROWS", "SEQ_ROWS"])
def combine_splits(PM, PL, PO, OUT, SPLITS, n_splits, ROWS, SEQ_ROWS, D: tl.constexpr,
                   BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BATCHED: tl.constexpr,
                   CHUNK_S: tl.constexpr, PDL: tl.constexpr):
    """Merge one row's splits: out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s, M = max m_s.
    OUT: [H_kv, ROWS, D]; a split past the row's position has l = 0 and weighs nothing.
    BATCHED: row r belongs to sequence r // SEQ_ROWS, which wrote its first SPLITS[seq] splits
    of the n_splits the layout holds. The partial outputs are read CHUNK_S splits at a time, as
    many as the row has, not a [BLOCK_S, D] tile of mostly empty splits (its registers cost more
    than the reads: docs/benchmark-log.md). The row's own split count alone
    sets the loop, so its bits are those of its step alone. PDL: fused_ops_kernel.pdl_options."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    head = tl.program_id(0).to(tl.int64)
    row = tl.program_id(1)
    if BATCHED:
        n_row = tl.load(SPLITS + row // SEQ_ROWS)
    else:
        n_row = n_splits
    s = tl.arange(0, BLOCK_S)
    at = (head * n_splits + s) * ROWS + row  # [BLOCK_S]
    m = tl.load(PM + at, mask=s < n_row, other=float("-inf"))
    total = tl.load(PL + at, mask=s < n_row, other=0.0)  # l_s
    top = tl.max(m, 0)
    den = tl.sum(total * tl.where(total > 0, tl.exp(m - top), 0.0), 0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    c = tl.arange(0, CHUNK_S)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, n_row, CHUNK_S):
        ok = s0 + c < n_row
        at_c = (head * n_splits + s0 + c) * ROWS + row  # [CHUNK_S]
        m_c = tl.load(PM + at_c, mask=ok, other=float("-inf"))
        w_c = tl.where(tl.load(PL + at_c, mask=ok, other=0.0) > 0, tl.exp(m_c - top), 0.0)
        o = tl.load(PO + at_c[:, None] * D + d[None, :], mask=ok[:, None] & d_ok[None, :],
                    other=0.0)
        acc += tl.sum(o * w_c[:, None], 0)
    tl.store(OUT + (head * ROWS + row) * D + d, (acc / den).to(OUT.dtype.element_ty), mask=d_ok)
