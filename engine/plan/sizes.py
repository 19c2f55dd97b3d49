"""What each part of a plan takes, in bytes: weights in a format, KV per token in a dtype, the
forward pass's workspace, the margin; and the allowances the planner adds (plan/memory.py puts
them together). Pure arithmetic over engine.formats, no torch: the Qt app imports it.
"""

from __future__ import annotations

import math

from engine.formats import kv_dtypes, weights
from engine.formats.model_shape import ModelShape, PlanError

MiB, GiB = 1 << 20, 1 << 30
# the scaled KV dtypes: + fp16 scales per token per KV head (kv_dtypes.scale_groups), K and V
QUANTIZED_KV = kv_dtypes.NameView(kv_dtypes.quantized)
CUDA_CONTEXT_BYTES = 768 * MiB  # outside torch's allocator: the bare context plus the kernels
# loaded and graphs made by the time a 32K generation ends (docs/benchmark-log.md, the planner
# against NVML)
CUBLAS_WORKSPACE_BYTES = 32 * MiB  # torch's default cuBLAS workspace on Hopper (:4096:8)
GRAPH_POOL_BASE_BYTES = 64 * MiB  # private pool of the captured decode graphs (+ decode tensors)
PREFILL_GRAPH_TOKENS = 1024  # the longest prefill chunk replayed as a CUDA graph: its pool keeps
# a pass of this many tokens' activations while the model is loaded (step/prefill_graphs.py)
MARGIN_FRACTION, MARGIN_MIN, MARGIN_MAX = 0.05, 256 * MiB, 2 * GiB  # allocator fragmentation
PREFILL_CHUNK = 512  # the smallest prefill pass the engine uses; larger where memory allows
KV_BLOCK_SIZE = 16  # tokens a block of the paged KV arena (cache/kv_cache.py says why)
LOGITS_BYTES_PER_ENTRY = 24  # bf16 logits + fp32 copy + fp32 probs + int64 sort index + fp32 sort


def seed_kv_cache_size(num_layers: int, num_heads: int, head_dim: int, seq_len: int,
                       batch_size: int, dtype_size: int = 2) -> int:
    """The seed's kv_cache_size, verbatim: K and V, one copy each."""
    return 2 * num_layers * num_heads * head_dim * seq_len * batch_size * dtype_size


def expert_linear_bytes(out: int, inp: int, quant: str) -> int:
    """One expert's linear as the loader keeps it: 4-bit codes packed [out, inp / 8] int32 and
    per group of inputs and output a bf16 scale (and offset), or 16 bits where the format keeps
    experts so (int8) or no group of it divides `inp` (the load refuses those)."""
    group = weights.expert_group(quant, inp)
    if group is None:
        return 2 * out * inp
    return out * inp // 2 + 2 * weights.get(quant).expert_group_numbers * out * (inp // group)


def weight_bytes(shape: ModelShape, quant: str, double_quant: bool | None = None) -> int:
    """Bytes of the weights in `quant`; embeddings, lm_head, norms and biases stay 16-bit."""
    if quant not in weights.names():
        raise PlanError(f"unknown weight format {quant!r}; choose from "
                        f"{', '.join(weights.names())}")
    fmt = weights.get(quant)
    if not fmt.quantized:
        return shape.total_params * fmt.bits // 8
    group = shape.quant_group_size
    total = 2 * (shape.embed_params + shape.lm_head_params + shape.other_params)
    # experts leave `linears`, which counts them among the linears of their (out, in) shape: the
    # loader keeps them in their own 4-bit layout (quant/experts4.py), or 16 bits under int8
    counts = {(o, i): 0 for o, i, _ in shape.linears}
    for out, inp, count in shape.linears:
        counts[out, inp] += count
    for out, inp, count in shape.expert_linears:
        counts[out, inp] -= count
        total += expert_linear_bytes(out, inp, quant) * count
    for (out, inp), count in counts.items():
        total += fmt.linear_bytes(out, inp, group, double_quant) * count
    return total


def kv_bytes_per_token(shape: ModelShape, kv_dtype: str) -> int:
    """layers x KV heads x (K and V) x (head_dim x dtype bytes + fp16 scales): GQA counts right."""
    if kv_dtype not in kv_dtypes.names():
        raise PlanError(f"unknown KV dtype {kv_dtype!r}; choose from "
                        f"{', '.join(kv_dtypes.names())}")
    kv = kv_dtypes.get(kv_dtype)
    scales = 2 * kv_dtypes.scale_groups(shape.head_dim) if kv.scaled else 0
    per_head = shape.head_dim * kv.bytes_per_element + scales
    return shape.num_layers * shape.num_kv_heads * 2 * per_head


def kv_arena_tokens(context: int) -> int:
    """Token slots of the arena for `context`: whole blocks (at most a block more)."""
    return -(-context // KV_BLOCK_SIZE) * KV_BLOCK_SIZE


def ring_blocks(window: int, chunk: int, block_size: int = KV_BLOCK_SIZE) -> int:
    """Blocks a sequence's ring of a sliding layer holds (cache/sliding_pool.py): the keys the
    queries of a pass of `chunk` tokens read (window - 1 before the pass's first position, and
    the pass itself: n = window + chunk - 1 positions in a row) span at most
    floor((n - 1) / block_size) + 1 = ceil(n / block_size) blocks, at any alignment, so none is
    overwritten by a later token of the same pass (tests/engine/batch/test_sliding_scheduler.py
    finds a ring of one token less overwritten)."""
    return -(-(window + chunk - 1) // block_size)


def ring_tokens(shape: ModelShape, context: int, chunk: int) -> int:
    """Token slots a sequence's ring holds for each sliding layer (at most the context's)."""
    return min(ring_blocks(shape.local_window, chunk), -(-context // KV_BLOCK_SIZE)) \
        * KV_BLOCK_SIZE


def kv_arena_bytes(shape: ModelShape, kv_dtype: str, context: int, seqs: int,
                   chunk: int) -> int:
    """The KV arenas of `seqs` sequences of `context` tokens as the cache allocates them
    (scratch blocks apart): every layer at the context in whole blocks, but where the family
    masks its local layers (shape.local_layers), those at a ring a sequence, whose size the
    longest pass (`chunk`) sets."""
    per_layer = kv_bytes_per_token(shape, kv_dtype) // shape.num_layers
    full = (shape.num_layers - shape.local_layers) * kv_arena_tokens(context)
    local = shape.local_layers * ring_tokens(shape, context, chunk) if shape.local_layers else 0
    return per_layer * (full + local) * seqs


def margin_bytes(vram_bytes: int | None) -> int:
    """Allocator fragmentation and driver slack: 5% of the card, at least 256 MiB, at most 2 GiB."""
    if vram_bytes is None:
        return MARGIN_MIN
    return min(max(MARGIN_MIN, int(vram_bytes * MARGIN_FRACTION)), MARGIN_MAX)


def vram_needed(base_bytes: int) -> int:
    """The smallest card that holds `base_bytes` plus the margin that card would need."""
    cands = (base_bytes + MARGIN_MIN, math.ceil(base_bytes / (1 - MARGIN_FRACTION)),
             base_bytes + MARGIN_MAX)
    return min(v for v in cands if v >= base_bytes + margin_bytes(v))


def workspace_bytes(shape: ModelShape, quant: str, kv_dtype: str, tokens: int, rows: int,
               kv_tokens: int) -> int:
    """Transient bytes of one forward over `tokens` tokens, `rows` logits rows.

    One decoder layer is live at a time: residual, its norm, attention and MLP outputs
    (4 x hidden), q/k/v and the attention output, gate/up/act(gate)*up (3 x intermediate; a
    mixture of experts: that of each of a token's top-k experts, and each one's output).
    Assumes flash / memory-efficient attention (no chunk x context score matrix) and logits for
    the last position of each sequence only (+ the draft tokens being verified), bf16 then fp32
    for sampling; a quantized format's prefill products add their own (formats/weights.py);
    prefill attention reads a contiguous copy of one layer's K/V gathered from the paged arena
    (SDPA cannot read blocks in place), dequantized to the compute dtype for an int8/fp8 cache.
    """
    fmt = weights.get(quant)
    a = 2 if fmt.quantized else fmt.bits // 8  # the compute dtype: quantized formats run in 16
    s = shape
    mlp = 3 * s.intermediate_size
    if s.expert_linears:  # each token's top-k experts: gate/up/act of each, and each one's output
        width = next(o for o, i, _ in s.expert_linears if i == s.hidden_size)
        mlp = s.experts_per_token * (3 * width + s.hidden_size)
    act = tokens * a * (4 * s.hidden_size + mlp + 2 * (s.num_heads + s.num_kv_heads) * s.head_dim)
    scratch = fmt.prefill_scratch(s.linears, tokens)  # the format's own, dequantized weights
    kv = kv_dtypes.get(kv_dtype)
    copy = a if kv.scaled else kv.bytes_per_element
    scratch += kv_tokens * s.num_kv_heads * s.head_dim * 2 * copy
    return act + rows * s.vocab_size * LOGITS_BYTES_PER_ENTRY + scratch
