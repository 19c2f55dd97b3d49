"""The engine's attention function, registered with transformers' AttentionInterface.

Every supported architecture calls it from its own attention module. It owns the KV cache
writes (cache/kv_cache.py), the masking (causal without a materialized mask where it can) and
grouped-query attention (SDPA `enable_gqa`: KV heads are never expanded). transformers' own
cache and mask building are switched off: the model runs with no cache and a `None` mask.
Prefill reads the cache through SDPA over a contiguous copy of the blocks it needs, gathered
through the block table a layer at a time (dequantized for int8/fp8; the planner counts this copy
in its workspace); one-token steps go to attention/decode_attention.py where it applies (a GPU with
Triton;
an int8/fp8 cache anywhere), which reads the paged cache in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from engine.attention import decode_attention, sliding_window
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
    attention: str = field(init=False)  # how one-token steps read the cache: once a pass

    def __post_init__(self):
        self.cache.reserve(self.end)  # blocks for every position this pass writes
        self.attention = decode_attention.backend(self.cache)


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
    how, window, softcap = step.attention, kwargs.get("sliding_window"), kwargs.get("softcap")
    if (window is not None and step.end > window) or softcap is not None:
        # a local layer past its window (Gemma 2, 3), or soft-capped logits (Gemma 2)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        if cache.past_ring(layer, T):  # a whole text at once (hearth eval): its own K/V
            if step.start:
                raise ValueError(f"a pass of {T} tokens from position {step.start} is longer "
                                 f"than the sliding layers' ring covers ({cache.max_pass})")
            out = sliding_window.attend_kv(query, key.to(query.dtype), value.to(query.dtype),
                                           step.positions, window, scale, softcap)
        else:
            out = sliding_window.attend(query, cache.layer(layer), step.positions, step.end,
                                        window, scale, softcap)
        return out.view(1, T, query.shape[1], query.shape[3]), None
    if T == 1 and how != "sdpa":  # split-context decode, reading int8/fp8 as stored
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = decode_attention.attend(query, cache.layer(layer), step.positions, step.end, scale,
                                      how, launch=cache.backends.launch)
        return out.transpose(1, 2).contiguous(), None
    # SDPA cannot read the paged arena: a contiguous copy of positions 0..end-1
    k, v = cache.read(layer, step.end, query.dtype)  # [1, H_kv, end, D]
    q = query.to(k.dtype)
    if T == 1:
        out = F.scaled_dot_product_attention(q, k, v, scale=scaling, enable_gqa=True)
    elif step.start == 0:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling,
                                             enable_gqa=True)
    else:
        # query i sits at start+i and sees keys 0..start+i: causal aligned to the lower right
        # (is_causal aligns top-left); a CausalBias keeps the flash kernel and builds no mask
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(T, step.end),
                                             scale=scaling, enable_gqa=True)
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
