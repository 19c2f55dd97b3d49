"""The attention of a batched decode step (FamilyStep.batch): N sequences, one token each, each
reading its own blocks (rows.table) up to its own KV bucket. Three ways, by the cache's decode
path: the Triton kernel, all rows in one launch, each row as its step alone computes it; PyTorch's
SDPA in one call over every row's gathered blocks; and, in the reproducible mode, SDPA a row at
a time exactly as each row's step alone calls it (its bits must not depend on the batch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from engine.attention import decode_attention
from engine.attention.decode_attention import BatchRows
from engine.cache import kv_arena
from engine.cache.kv_cache import LayerKV

if TYPE_CHECKING:  # the step holds the attention, not the other way round
    from engine.models.layers import Attention, FamilyStep


def of(step: FamilyStep, pos: torch.Tensor, rows: BatchRows) -> Attention:
    """pos: [N] (device) -> attention(layer, q [1, H, N, D], kv) -> [1, N, H D]."""
    how = decode_attention.backend(step.cache)
    if how == "sdpa" and step.invariant is None:
        return _one_sdpa_call(step, pos, rows.kv_len)
    if how == "sdpa":
        return _sdpa_row_by_row(step, pos, rows)

    def attention(i: int, q: torch.Tensor, kv: LayerKV) -> torch.Tensor:
        return decode_attention.attend_batch(q, kv, pos, rows, step.scaling, how,
                                             launch=step.cache.backends.launch)
    return attention


def _one_sdpa_call(step: FamilyStep, pos: torch.Tensor, kv_len: int) -> Attention:
    """Each row's blocks gathered up to the batch's largest bucket, keys past a row's position
    masked (16-bit and fp32 caches)."""
    keys = torch.arange(kv_len, device=pos.device)
    mask = (keys[None, :] <= pos[:, None])[:, None, None, :]  # [N, 1, 1, kv]
    group = step.num_heads // step.num_kv_heads

    def attention(i: int, q: torch.Tensor, kv: LayerKV) -> torch.Tensor:
        N, D = q.shape[2], step.head_dim
        k, v = (kv_arena.contiguous_rows(x, kv.table[:N], kv_len) for x in (kv.k, kv.v))
        # q: [1, H, N, D] -> [N, H_kv, G, D], heads h_kv G + g
        qg = q[0].transpose(0, 1).reshape(N, step.num_kv_heads, group, D).to(k.dtype)
        out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=step.scaling)
        return out.reshape(1, N, step.num_heads * D).to(q.dtype)  # [1, N, H D]
    return attention


def _sdpa_row_by_row(step: FamilyStep, pos: torch.Tensor, rows: BatchRows) -> Attention:
    """PyTorch's kernels a row at a time, each called as its step alone calls them."""
    def attention(i: int, q: torch.Tensor, kv: LayerKV) -> torch.Tensor:
        out = []
        for r, L in enumerate(rows.host_lens):
            mask = (torch.arange(L, device=pos.device) <= pos[r])[None, None, None, :]
            out.append(step.attend(q[:, :, r:r + 1], kv._replace(table=kv.table[r]), mask, L))
        return torch.cat(out, dim=1)  # [1, N, H D]
    return attention
