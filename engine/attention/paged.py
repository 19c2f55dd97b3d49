"""Attention over the paged arena: one object per cache (`of`), a class per way of reading it,
chosen from the name kernels/attention_backend.py gives the cache (its setting, this machine,
its kernel health). Every entry point takes the pass's positions and rows once and returns the
per-layer call `(q [1, H, T, D], kv: LayerKV) -> [1, T, H D]`:

- `over`: the one call for a pass of any rows (decode rows, verify rows, prefill chunks), each
  with its queries among the pass's, its block table and its KV bucket (Row), causal inside the
  row; within a window and soft-capped where a layer is (attention/sliding_window.py);
- `batch`: a batched decode step with its buckets in device tensors (BatchRows), graph-safe;
- `causal`: a prefill chunk of the bound sequence through SDPA's causal kernels.

Reference reads a gathered fp32 copy through the split algorithm (decode_attention.reference),
Sdpa a gathered copy through PyTorch's SDPA (16-bit caches), Triton the blocks in place through
the split-context kernel (kernels/decode_attention_kernel.py).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from engine.attention import decode_attention, sliding_window
from engine.attention.decode_attention import BatchRows
from engine.cache import kv_arena
from engine.cache.kv_cache import KVCache, LayerKV

# (q [1, H, T, D], kv) -> [1, T, H D]; a row's, inside `over`, takes the pass's shared reads too
Attend = Callable[[torch.Tensor, LayerKV], torch.Tensor]


class Row(NamedTuple):
    """One row of a pass: its queries lo..hi-1 among the pass's, reading keys 0..kv_len-1 (each
    query those up to its own position) through `table` (None: the layer's own)."""

    lo: int
    hi: int
    kv_len: int
    table: torch.Tensor | None = None


def tokens_major(out: torch.Tensor) -> torch.Tensor:
    """[1, H, T, D] -> [1, T, H D]."""
    return out.transpose(1, 2).reshape(1, out.shape[2], out.shape[1] * out.shape[3])


class Reference:
    """The split-context algorithm in PyTorch over a gathered fp32 copy of the blocks."""

    name, what = "reference", "the split-context algorithm in PyTorch (no Triton kernel)"
    in_place = False  # the Triton kernel: reads the blocks in place, takes short prefill chunks,
    # gives a run of rows sharing a bucket the bits of single steps, runs captured batched steps
    steps_split = True  # one-token steps of transformers' modules go through `_decode`

    def __init__(self, cache: KVCache):
        self.launch, self.device = cache.backends.launch, cache.device
        self.num_kv_heads, self.quantized = cache.num_kv_heads, cache.quantized

    def splits(self, kv_len: int) -> int:
        """The splits a step's bucket of kv_len is cut into (1 where nothing reads it)."""
        return 1

    def _decode(self, pos: torch.Tensor, kv_len: int, scaling: float) -> Attend:
        """One row's queries at pos [T] over its bucket; fixed shapes, no host sync."""
        return lambda q, kv, reads=None: tokens_major(
            decode_attention.reference(q, kv, pos, kv_len, scaling))

    def _row(self, pos: torch.Tensor, kv_len: int, scaling: float, window: int | None,
             softcap: float | None) -> Attend:
        if window is None and softcap is None:
            return self._decode(pos, kv_len, scaling)
        return lambda q, kv, reads=None: sliding_window.attend(
            q, *kv_arena.gather(*kv, kv_len, q.dtype), pos, window, scaling, softcap)

    def over(self, pos: torch.Tensor, rows: list[Row], scaling: float,
             window: int | None = None, softcap: float | None = None) -> Attend:
        """A pass of `rows` at positions pos [T] (row r's: pos[r.lo:r.hi])."""
        parts = [(r, self._row(pos[r.lo:r.hi], r.kv_len, scaling, window, softcap))
                 for r in rows]
        if len(parts) == 1 and parts[0][0].table is None:
            return parts[0][1]

        def attend(q: torch.Tensor, kv: LayerKV) -> torch.Tensor:
            reads: dict = {}  # gathered copies, shared by the rows of one table and bucket
            return torch.cat([fn(q[:, :, r.lo:r.hi], kv if r.table is None else
                                 kv._replace(table=r.table), reads) for r, fn in parts], dim=1)
        return attend

    def batch(self, pos: torch.Tensor, rows: BatchRows, scaling: float, exact: bool = False,
              window: int | None = None, softcap: float | None = None) -> Attend:
        """A batched decode step: row i's token at pos[i] over kv.table[i] (rows.table, or the
        sliding layers' rows.ring) up to its own bucket, as its step alone reads it. `exact`:
        the reproducible mode (each row's bits its step's alone)."""
        fast = window is None and softcap is None and self._batch(pos, rows, scaling, exact)
        if fast:
            return fast
        lens = rows.host_lens or (rows.kv_len,) * pos.shape[0]
        return lambda q, kv: self.over(pos, [Row(i, i + 1, L, kv.table[i]) for i, L in
                                             enumerate(lens)], scaling, window, softcap)(q, kv)

    def _batch(self, pos: torch.Tensor, rows: BatchRows, scaling: float,
               exact: bool) -> Attend | None:
        """The batched step's own path, where it has one (None: a row at a time)."""
        return None

    def causal(self, start: int, end: int, scaling: float | None, window: int | None = None,
               softcap: float | None = None) -> Attend:
        """A prefill chunk at start..end-1 of the layer's own table: causal flash attention
        over a contiguous copy of positions 0..end-1, as transformers' modules take it."""
        if window is not None or softcap is not None:
            return self.over(torch.arange(start, end, device=self.device),
                             [Row(0, end - start, end)], scaling, window, softcap)
        return lambda q, kv: tokens_major(causal(q, kv, start, end, scaling)).to(q.dtype)


class Sdpa(Reference):
    """PyTorch's SDPA over a gathered copy of the bucket's blocks (16-bit and fp32 caches): the
    numerics of prefill and of transformers' modules, so the family step stays token-identical
    to them."""

    name, what = "sdpa", "PyTorch SDPA over a gathered copy of the blocks"
    steps_split = False

    def _decode(self, pos: torch.Tensor, kv_len: int, scaling: float) -> Attend:
        mask = torch.arange(kv_len, device=pos.device)[None, :] <= pos[:, None]  # [T, kv]
        return lambda q, kv, reads=None: self.attend(q, kv, mask, kv_len, scaling, reads)

    @staticmethod
    def attend(q: torch.Tensor, kv: LayerKV, mask: torch.Tensor, kv_len: int, scaling: float,
               reads: dict | None = None) -> torch.Tensor:
        """Grouped-query attention without expanding KV heads: the G query heads that share a
        KV head become G queries of it. q: [1, H, T, D] -> [1, T, H D]; mask [T, kv_len];
        `reads`: the gathered copies of a pass's rows so far, by table and bucket."""
        _, H, T, D = q.shape
        Hkv, dtype, key = kv.k.shape[1], q.dtype, (kv.table.data_ptr(), kv_len)
        k, v = (reads or {}).get(key) or kv_arena.gather(*kv, kv_len, kv.k.dtype)
        if reads is not None:  # [1, H_kv, kv_len, D]
            reads[key] = k, v
        mask = mask[None, None] if T == 1 else mask.repeat(H // Hkv, 1)[None, None]
        q = q.reshape(1, Hkv, H // Hkv * T, D).to(k.dtype)  # rows g T + t: group g, token t
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling).to(dtype)
        if T == 1:
            return out.reshape(1, 1, H * D)  # kernels may permute it
        return out.view(1, Hkv, H // Hkv, T, D).permute(0, 3, 1, 2, 4).reshape(1, T, H * D)

    def _batch(self, pos: torch.Tensor, rows: BatchRows, scaling: float,
               exact: bool) -> Attend | None:
        """Outside the reproducible mode, one SDPA call: each row's blocks gathered up to the
        batch's largest bucket, keys past a row's position masked."""
        if exact:
            return None
        keys = torch.arange(rows.kv_len, device=pos.device)
        mask = (keys[None, :] <= pos[:, None])[:, None, None, :]  # [N, 1, 1, kv]

        def attend(q: torch.Tensor, kv: LayerKV) -> torch.Tensor:
            _, H, N, D = q.shape
            Hkv = kv.k.shape[1]
            k, v = (kv_arena.contiguous_rows(x, kv.table[:N], rows.kv_len) for x in (kv.k, kv.v))
            # q: [1, H, N, D] -> [N, H_kv, G, D], heads h_kv G + g
            qg = q[0].transpose(0, 1).reshape(N, Hkv, H // Hkv, D).to(k.dtype)
            out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scaling)
            return out.reshape(1, N, H * D).to(q.dtype)  # [1, N, H D]
        return attend


class Triton(Reference):
    """The split-context kernel (kernels/decode_attention_kernel.py), reading the blocks, int8
    and fp8 values and their scales included, in place through the table."""

    name, what = "triton", "the Triton split-context kernel, reading the blocks in place"
    in_place = True

    def splits(self, kv_len: int) -> int:
        from engine.kernels import decode_attention_kernel

        return decode_attention_kernel.splits_for(kv_len, self.num_kv_heads, self.device,
                                                  self.launch, self.quantized)

    def _decode(self, pos: torch.Tensor, kv_len: int, scaling: float) -> Attend:
        return lambda q, kv, reads=None: tokens_major(
            decode_attention.kernel(q, kv, pos, kv_len, scaling, self.launch))

    def _batch(self, pos: torch.Tensor, rows: BatchRows, scaling: float,
               exact: bool) -> Attend | None:
        """Every row in one launch, each as its step alone computes it (exact as it is)."""
        from engine.kernels import decode_attention_kernel

        return lambda q, kv: decode_attention_kernel.batched_decode_attention(
            q, kv, pos, rows.lens, rows.splits, rows.kv_len, scaling, self.launch)


IMPLEMENTATIONS = {c.name: c for c in (Reference, Sdpa, Triton)}
_made: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def of(cache: KVCache) -> Reference:
    """The cache's attention: made on first use, again only where its path changed (a kernel
    that failed its load check; the choice is the cache's, attention_backend.backend)."""
    name, att = cache.decode_attention, _made.get(cache)
    if att is None or att.name != name:
        att = _made[cache] = IMPLEMENTATIONS[name](cache)
    return att


def describe(cache: KVCache) -> str:
    """One line for the load notes."""
    return f"decode attention over the {cache.kv_dtype} KV cache: {of(cache).what}"


def causal(q: torch.Tensor, kv: LayerKV, start: int, end: int, scaling: float | None,
           mask: bool = True) -> torch.Tensor:
    """q [1, H, T, D] at start..end-1 over a contiguous copy of positions 0..end-1 (a quantized
    cache dequantized to q's dtype, a 16-bit one in its own) -> [1, H, T, D] in that dtype; no
    mask where not `mask` (one token sees every key)."""
    k, v = kv_arena.gather(*kv, end, q.dtype if kv.k_scale is not None else kv.k.dtype)
    q, T = q.to(k.dtype), q.shape[2]
    if not mask:
        return F.scaled_dot_product_attention(q, k, v, scale=scaling, enable_gqa=True)
    if start == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling,
                                              enable_gqa=True)
    # query i sits at start+i and sees keys 0..start+i: causal aligned to the lower right
    # (is_causal aligns top-left); a CausalBias keeps the flash kernel and builds no mask
    from torch.nn.attention.bias import causal_lower_right  # imports dynamo: 1.5 s

    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(T, end),
                                          scale=scaling, enable_gqa=True)
