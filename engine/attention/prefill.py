"""The engine's attention function, registered with transformers' AttentionInterface.

Every supported architecture calls it from its own attention module. It owns the KV cache
writes (cache/kv_cache.py), the masking (causal without a materialized mask where it can) and
grouped-query attention (SDPA `enable_gqa`: KV heads are never expanded). transformers' own
cache and mask building are switched off: the model runs with no cache and a `None` mask.
Prefill reads the cache through SDPA over a contiguous copy of the blocks it needs, gathered
through the block table a layer at a time (dequantized for int8/fp8; the planner counts this copy
in its workspace); one-token steps go through the cache's attention (attention/paged.py) where it
splits the context (a GPU with Triton, reading the paged cache in place; an int8/fp8 cache
anywhere).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.attention import paged, sliding_window
from engine.cache import key_rotation
from engine.cache.kv_cache import KVCache

ATTN_IMPLEMENTATION = "hearth"


@dataclass
class StepContext:
    """What one forward pass writes and reads: positions start..end-1 of `cache`.

    Passed to the model as the keyword `hearth_step`; transformers forwards unknown keywords
    down to the attention function.
    """

    cache: KVCache
    positions: torch.Tensor  # [T] int64 on the cache's device
    start: int  # host copies of the bounds: no device sync to slice
    end: int
    attention: paged.Reference = field(init=False)  # the cache's (attention/paged.py)

    def __post_init__(self):
        self.cache.reserve(self.end)  # blocks for every position this pass writes
        self.attention = paged.of(self.cache)


def hearth_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     **kwargs):
    """query: [1, H, T, D]; key, value: [1, H_kv, T, D] for the new tokens only."""
    step: StepContext | None = kwargs.get("hearth_step")
    if step is None:
        raise RuntimeError("hearth attention called without a hearth_step context")
    layer, cache, T = module.layer_idx, step.cache, query.shape[2]
    # written first, read back after: a token is quantized (int8/fp8) before anything reads it,
    # its own query included, so results do not depend on how tokens were grouped into passes;
    # an int8/fp8 cache holds rotated keys, read by rotated queries (cache/key_rotation.py)
    query, key = key_rotation.rotate_qk(query, key, cache.key_rotation)
    cache.write(layer, step.positions, key, value)
    att, window, softcap = step.attention, kwargs.get("sliding_window"), kwargs.get("softcap")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    # a local layer past its window (Gemma 2, 3), or soft-capped logits (Gemma 2)
    windowed = (window is not None and step.end > window) or softcap is not None
    if windowed and cache.past_ring(layer, T):  # a whole text at once (hearth eval): its K/V
        if step.start:
            raise ValueError(f"a pass of {T} tokens from position {step.start} is longer "
                             f"than the sliding layers' ring covers ({cache.max_pass})")
        out = sliding_window.attend(query, key.to(query.dtype), value.to(query.dtype),
                                       step.positions, window, scale, softcap)
        return out.view(1, T, query.shape[1], query.shape[3]), None
    if windowed or (T == 1 and att.steps_split):  # split-context decode reads int8/fp8 as stored
        out = att.over(step.positions, [paged.Row(0, T, step.end)], scale,
                       window if windowed else None, softcap)(query, cache.layer(layer))
        return out.view(1, T, query.shape[1], query.shape[3]), None
    # SDPA cannot read the paged arena: a contiguous copy of positions 0..end-1
    out = paged.causal(query, cache.layer(layer), step.start, step.end, scaling, mask=T > 1)
    # out: [1, H, T, D] -> [1, T, H, D], the layout transformers' modules expect back
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def _no_mask(*args, **kwargs):
    """The mask is built inside hearth_attention from the step's bounds."""
    return None


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, hearth_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _no_mask)
