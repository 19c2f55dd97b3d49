"""Decode attention over the engine's paged cache (16-bit, int8 or fp8): T query tokens (1 a step,
K + 1 in a verify block) against cache positions below a host bucket `kv_len`, each token seeing
keys up to its own position, read from a device tensor: one captured graph serves a whole
bucket. Keys are found through the sequence's block table (cache/kv_cache.py), a device tensor too.

Flash-decoding: the context is cut into splits; each split yields, per query row, a partial max m,
sum l and unnormalized output o, and a combine step merges them (the log-sum-exp rule below). The
G query heads that share a KV head are the rows of one program, so K/V are read once per group.
The Triton kernels (kernels/decode_attention_kernel.py, through `kernel`) read the blocks in
place through the table, int8/fp8 values and their scales included, never a copy; `reference` is
the same algorithm in PyTorch over a gathered copy, for CPU, for GPUs without Triton, and for
tests; `check_kernel` is the kernel's load check. attention/paged.py chooses between them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine.cache import kv_arena
from engine.cache.kv_cache import KVCache, LayerKV
from engine.kernels import attention_backend
from engine.kernels.decode_splits import MAX_SPLITS, MIN_SPLIT_TOKENS, num_splits  # noqa: F401


class BatchRows(NamedTuple):
    """The N sequences of a batched decode step (one token each), beside their tokens and
    positions: table [>= N, max_blocks] int32, row i sequence i's blocks; lens [N] int32, each
    row's own KV bucket (the one its step alone would read); splits [N] int32, that bucket's
    split count (the attention's `splits`); kv_len, the largest bucket (a host int, fixed per
    captured graph); host_lens, the buckets as host ints for the eager per-row paths (None
    inside a graph); ring [>= N, max_blocks] int32, the sliding layers' table of each row, where
    the cache keeps only their window (cache/sliding_pool.py; None: they read `table`)."""

    table: torch.Tensor
    lens: torch.Tensor
    splits: torch.Tensor
    kv_len: int
    host_lens: tuple[int, ...] | None
    ring: torch.Tensor | None = None


CHECK_TOKENS = 300  # the load check's cache: splits of 64, the last partly filled
CHECK_TOLERANCE = 2e-2  # relative norm; bf16 output and probabilities round at 2^-9 (the GPU
# tests see 2.2e-3), an addressing or masking mistake moves whole rows


def check_kernel(cache: KVCache, num_heads: int, dtype: torch.dtype) -> str | None:
    """At load, run the Triton kernel over a small random cache of this cache's kind and compare
    it with the PyTorch reference, for one query token and for a five-token verify block: where
    it cannot compile or run (no shared memory for a tile, an old driver) or computes something
    else (a GPU or Triton version it was never tested on), decode falls back to SDPA or the
    reference instead of failing, or answering wrongly, every step. -> a note for the load
    event, or None."""
    if cache.decode_attention != attention_backend.KERNEL_READS:
        return None
    kv0 = cache.layer(0)
    device, Hkv, D = kv0.k.device, kv0.k.shape[1], kv0.k.shape[-1]
    try:
        probe = KVCache(1, Hkv, D, CHECK_TOKENS, cache.kv_dtype, device,
                        backends=cache.backends, health=cache.health)
        probe.reserve(CHECK_TOKENS)  # blocks for every position the probe writes
        g = torch.Generator(device="cpu").manual_seed(0)
        k, v = (torch.randn(1, Hkv, CHECK_TOKENS, D, generator=g).to(device) for _ in range(2))
        probe.write(0, torch.arange(CHECK_TOKENS, device=device), k, v)
        kv = probe.layer(0)
        worst = 0.0
        for T in (1, 5):
            q = torch.randn(1, num_heads, T, D, generator=g).to(device, dtype)
            pos = torch.arange(CHECK_TOKENS - T, CHECK_TOKENS, device=device)
            out = kernel(q, kv, pos, CHECK_TOKENS, D ** -0.5, cache.backends.launch).float()
            ref = reference(q.float(), kv, pos, CHECK_TOKENS, D ** -0.5)
            worst = max(worst, ((out - ref).norm() / ref.norm()).item())
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # a failed launch reports here, not mid-generation
    except Exception as e:  # whatever broke, the kernel is not for this machine
        cache.health.mark_failed(attention_backend.KERNEL, device, cache.kv_dtype)
        return (f"the Triton decode-attention kernel failed here ({type(e).__name__}: "
                f"{str(e)[:200]}); decode attention falls back to {cache.decode_attention}")
    if not worst < CHECK_TOLERANCE:  # (NaN included)
        cache.health.mark_failed(attention_backend.KERNEL, device, cache.kv_dtype)
        return (f"the Triton decode-attention kernel disagreed with the reference here (relative "
                f"error {worst:.1e}); decode attention falls back to {cache.decode_attention}")
    return None


def kernel(q: torch.Tensor, kv: LayerKV, pos: torch.Tensor, kv_len: int, scaling: float,
           launch: dict | None = None) -> torch.Tensor:
    """The Triton kernel over one sequence: q [1, H, T, D], pos [T] -> [1, H, T, D] in q's
    dtype; `launch`: its launch overrides (the cache's backends.launch)."""
    from engine.kernels import decode_attention_kernel

    return decode_attention_kernel.decode_attention(q, kv, pos, kv_len, scaling, launch)


def reference(q: torch.Tensor, kv: LayerKV, pos: torch.Tensor, kv_len: int, scaling: float,
              split: int | None = None) -> torch.Tensor:
    """The kernel's algorithm in PyTorch, in fp32. q: [1, H, T, D], pos: [T] -> [1, H, T, D].

    `split`: keys per split (default: MIN_SPLIT_TOKENS). Fixed shapes, no host sync, so a GPU
    without Triton can still capture it in a graph (it gathers the table's blocks into a
    contiguous fp32 copy, dequantized, and reads that).
    """
    _, H, T, D = q.shape
    Hkv = kv.k.shape[1]
    G = H // Hkv
    split = split or MIN_SPLIT_TOKENS
    S = -(-kv_len // split)
    k, v = (x[0] for x in kv_arena.gather(*kv, kv_len, torch.float32))  # [H_kv, kv_len, D]
    pad = S * split - kv_len  # zero keys past kv_len, masked below: [H_kv, S, split, D]
    k = torch.nn.functional.pad(k, (0, 0, 0, pad)).view(Hkv, S, split, D)
    v = torch.nn.functional.pad(v, (0, 0, 0, pad)).view(Hkv, S, split, D)
    qg = q.float().reshape(Hkv, G * T, D)  # rows g T + t: the G heads of a KV head, token t
    row_pos = pos.repeat(G)  # [G T]
    keys = torch.arange(S * split, device=q.device).view(S, split)
    visible = (keys[:, None, :] <= row_pos[None, :, None]) & (keys < kv_len)[:, None, :]
    s = torch.einsum("hmd,hsnd->hsmn", qg, k) * scaling  # [H_kv, S, G T, split]
    s = s.masked_fill(~visible, float("-inf"))
    # per split: m = max s, l = sum exp(s - m), o = sum exp(s - m) v; an empty split keeps m=-inf
    m = s.amax(-1)  # [H_kv, S, G T]
    p = torch.exp(s - torch.where(m.isinf(), 0.0, m)[..., None])
    total, o = p.sum(-1), torch.einsum("hsmn,hsnd->hsmd", p, v)  # l: [H_kv, S, G T]
    # combine (log-sum-exp): M = max_s m_s, out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s
    w = torch.where(total > 0, torch.exp(m - m.amax(1, keepdim=True)), 0.0)  # [H_kv, S, G T]
    out = (w[..., None] * o).sum(1) / (w * total).sum(1)[..., None]  # [H_kv, G T, D]
    return out.view(1, H, T, D).to(q.dtype)  # [H_kv, G, T, D] is head-major: heads h_kv G + g
