"""Launching the Triton kernels of decode attention (kernels/decode_attention_programs.py): one
sequence's step, verify block or prefill chunk (decode_attention), or one step of a batch of
sequences (batched_decode_attention), with the launch settings chosen by a sweep.
attention/decode_attention.py holds the algorithm's description, its PyTorch reference and the
choice of path; this module is imported only there, on a CUDA device where Triton imports (CPU
torch ships no Triton; tests run it in Triton's interpreter).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import triton

from engine.events import MAX_SPECULATIVE_TOKENS
from engine.kernels.decode_attention_programs import combine_splits, partial_softmax
from engine.kernels.decode_splits import MAX_SPLITS, MIN_SPLIT_TOKENS, num_splits
from engine.kernels.fused_ops_kernel import pdl_options

if TYPE_CHECKING:  # the cache sits above the kernels; its view is only a parameter type here
    from engine.cache.kv_cache import LayerKV

# Launch settings, for 16-bit and for quantized caches: keys per loop iteration (block_n),
# programs per SM (waves), warps, pipeline stages, query rows per tile for steps and verify
# blocks (block_m), table entries read at a time (chunk); chosen by `bench/kv_attention_speed.py
# --sweep` (the measurements: docs/benchmark-log.md, "Tuning notes moved from the code"):
# - chunk: block ids read 64 at a time, so no load in the tile loop waits on another's address
#   and Triton pipelines the tiles;
# - block_m 16 (mma.sync): a step has 4-7 query rows, and a 64-row tile costs its registers;
# - fp16_dots with asm: int8 codes widened to fp16 exactly in PTX, e4m3 converted, dots in fp16;
# - consistent, granule 1,024: steps and verify blocks split alike (see decode_attention).
_SHARED = dict(consistent=True, granule=1024, block_m=16, chunk=64, waves=2, num_warps=4,
               num_stages=3, min_split=MIN_SPLIT_TOKENS)
CONFIGS = {False: dict(block_n=64, **_SHARED),
           True: dict(block_n=128, fp16_dots=True, asm=True, **_SHARED)}


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


COMBINE_SPLITS = triton.next_power_of_2(MAX_SPLITS)
COMBINE_CHUNK = 8  # partial outputs merged a chunk of splits at a time (combine_splits)
INTERPRETER_SMS = 4  # Triton's CPU interpreter (tests): a few splits, as on a small GPU
MAX_BLOCK_TOKENS = MAX_SPECULATIVE_TOKENS + 1  # a pass of more query tokens is a prefill chunk,
# not a step or a verify block, and needs no split to agree with a step's


def decode_attention(q: torch.Tensor, kv: LayerKV, pos: torch.Tensor, kv_len: int,
                     scaling: float, config: dict | None = None) -> torch.Tensor:
    """q: [1, H, T, D], pos: [T] int64 -> [1, H, T, D] in q's dtype. Launches only: no host
    sync, and shapes depend on (T, kv_len) alone, so a CUDA graph captures it per bucket.
    `config` overrides CONFIGS (a session's Backends.launch: benchmark sweeps)."""
    _, H, T, D = q.shape
    Hkv = kv.k.shape[1]
    rows = H // Hkv * T
    cfg = {**CONFIGS[kv.k_scale is not None], **(config or {})}
    qg = _query(q, kv).reshape(Hkv, rows, D).contiguous()
    sms = _num_sms(q.device.index or 0) if q.device.type == "cuda" else INTERPRETER_SMS
    S = num_splits(kv_len, Hkv, sms, cfg["waves"], cfg["min_split"])
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
    out = _launch(qg, kv, pos, None, None, kv_len, S, scaling, cfg, block_m, T, 1,
                  triton.cdiv(rows, block_m))
    return out.view(1, H, T, D).to(q.dtype)  # [H_kv, G, T, D]: head h_kv G + g


def batched_decode_attention(q: torch.Tensor, kv: LayerKV, pos: torch.Tensor,
                             lens: torch.Tensor, splits: torch.Tensor, kv_len: int,
                             scaling: float, config: dict | None = None) -> torch.Tensor:
    """One decode step of N sequences: q: [1, H, N, D] (token i of sequence i), kv.table:
    [>= N, max_blocks] int32 (row i: sequence i's blocks), pos: [N] int64, lens: [N] int32 (each
    sequence's own KV bucket), splits: [N] int32 (num_splits of that bucket, as its step alone
    would cut it); kv_len: the largest of lens (a host int: the grid) -> [1, N, H D] in q's
    dtype. Each sequence's rows are computed as decode_attention computes them for that
    sequence alone (its tile, its bucket, its split points), so a row's bits do not depend on
    the batch. Launches only, shapes fixed by (N, kv_len): graph-capturable."""
    _, H, N, D = q.shape
    Hkv = kv.k.shape[1]
    G = H // Hkv
    cfg = {**CONFIGS[kv.k_scale is not None], **(config or {})}
    if not cfg["consistent"]:
        raise ValueError("a batched step needs the consistent launch settings")
    # [1, H, N, D] -> [H_kv, N, G, D]: each sequence's G query heads of a KV head, together
    qg = _query(q, kv).view(Hkv, G, N, D).transpose(1, 2).contiguous()
    sms = _num_sms(q.device.index or 0) if q.device.type == "cuda" else INTERPRETER_SMS
    S = num_splits(kv_len, Hkv, sms, cfg["waves"], cfg["min_split"])
    block_m = int(cfg["block_m"])
    out = _launch(qg, kv, pos, lens, splits, kv_len, S, scaling, cfg, block_m, 1, N,
                  triton.cdiv(G, block_m))
    # [H_kv, N G, D] -> [N, H_kv, G, D] -> [1, N, H D]: heads h_kv G + g, as decode_attention's
    return out.view(Hkv, N, G, D).transpose(0, 1).reshape(1, N, H * D).to(q.dtype)


def splits_for(kv_len: int, num_kv_heads: int, device: torch.device, config: dict | None,
               quantized: bool) -> int:
    """The split count decode_attention gives a step's bucket of kv_len (T = 1)."""
    cfg = {**CONFIGS[quantized], **(config or {})}
    sms = _num_sms(device.index or 0) if device.type == "cuda" else INTERPRETER_SMS
    return num_splits(kv_len, num_kv_heads, sms, cfg["waves"], cfg["min_split"])


def _query(q: torch.Tensor, kv: LayerKV) -> torch.Tensor:
    """A 16-bit cache is read in its own dtype (as the SDPA path does); a quantized one upcasts
    its values to the query's dtype inside the kernel."""
    return q if kv.k_scale is not None else q.to(kv.k.dtype)


def _launch(qg: torch.Tensor, kv: LayerKV, pos: torch.Tensor, lens: torch.Tensor | None,
            splits: torch.Tensor | None, kv_len: int, S: int, scaling: float, cfg: dict,
            block_m: int, T: int, seqs: int, seq_tiles: int) -> torch.Tensor:
    """Both kernels over qg: [H_kv, seqs, rows, D] (contiguous; rows = G T) -> [H_kv, seqs rows,
    D] in qg's dtype; `lens` and `splits` given: a batched step (T = 1)."""
    Hkv, rows, D = qg.shape[0], qg.shape[-2], qg.shape[-1]
    B = kv.k.shape[2]
    quantized = kv.k_scale is not None
    batched = lens is not None
    chunk = int(cfg.get("chunk", 0))  # table entries a gather serves; off where a tile would
    # straddle two chunks, or a split could start inside a block (splits start at multiples of
    # block_n: a chunk's gather counts blocks from the split's first key)
    if chunk and ((chunk * B) % cfg["block_n"] or cfg["block_n"] % B):
        chunk = 0
    all_rows = seqs * rows
    part_m = torch.empty((Hkv, S, all_rows), dtype=torch.float32, device=qg.device)
    part_l = torch.empty_like(part_m)
    part_o = torch.empty((Hkv, S, all_rows, D), dtype=torch.float32, device=qg.device)
    out = torch.empty((Hkv, all_rows, D), dtype=qg.dtype, device=qg.device)
    block_d = max(16, triton.next_power_of_2(D))
    ks = kv.k_scale if quantized else kv.k  # unread when not QUANTIZED: any pointer will do
    vs = kv.v_scale if quantized else kv.v
    groups = ks.shape[3] if quantized else 1  # scales per key per head (kernels/kv_quant.py)
    table_stride = kv.table.stride(0) if batched else 0
    lens = pos if lens is None else lens  # unread when not BATCHED
    splits = pos if splits is None else splits
    pdl = pdl_options(qg.device, seqs * T)
    partial_softmax[(Hkv, S, seqs * seq_tiles)](
        qg, kv.k, kv.v, ks, vs, kv.table, pos, lens, splits, part_m, part_l, part_o, kv_len, S,
        float(scaling), kv.k.stride(0), kv.k.stride(1), ks.stride(0), ks.stride(1),
        ROWS=rows, T=T, SEQS=seqs, SEQ_TILES=seq_tiles, TABLE_STRIDE=table_stride, D=D, B=B,
        BLOCK_M=block_m, BLOCK_N=cfg["block_n"], BLOCK_D=block_d,
        QUANTIZED=quantized, NG=groups, G=D // groups, IEEE=qg.dtype == torch.float32,
        GRANULE=int(cfg["granule"]) if cfg["consistent"] else 0,
        F16=bool(quantized and cfg.get("fp16_dots") and qg.dtype != torch.float32),
        INT8=kv.k.dtype == torch.int8,
        ASM=bool(cfg.get("asm")) and qg.device.type == "cuda",  # PTX: not in the interpreter
        CHUNK=chunk, BATCHED=batched, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **pdl)
    # one tile size for every split count: a row's sum over its splits is the same reduction
    # whether its pass had few splits (a step alone) or the batch's most
    combine_splits[(Hkv, all_rows)](part_m, part_l, part_o, out, splits, S, ROWS=all_rows,
                              SEQ_ROWS=rows, D=D, BLOCK_S=COMBINE_SPLITS, BLOCK_D=block_d,
                              BATCHED=batched, CHUNK_S=COMBINE_CHUNK, num_warps=4, **pdl)
    return out
