"""How flash-decoding cuts a KV bucket into splits: shared by the Triton kernel and the PyTorch
reference (attention/decode_attention.py), which must agree on it."""

from __future__ import annotations

MIN_SPLIT_TOKENS = 64  # a split shorter than this costs more in launch and combine than it saves
# (measured on a 7B's 1,024-key bucket: docs/benchmark-log.md). Long contexts are cut by the
# programs wanted instead
MAX_SPLITS = 64  # the combine kernel holds one split per row of a [splits, D] tile


def num_splits(kv_len: int, num_kv_heads: int, num_sms: int, waves: int = 2,
               min_tokens: int = MIN_SPLIT_TOKENS) -> int:
    """Splits per KV head for a bucket: enough (head, split) programs for `waves` programs per
    SM, none shorter than `min_tokens` at the bucket's full length."""
    if not isinstance(min_tokens, int) or min_tokens < 1:  # a launch setting from the environment
        raise ValueError(f"min_split must be a positive number of keys, not {min_tokens!r}")
    want = -(-waves * num_sms // num_kv_heads)
    return max(1, min(want, MAX_SPLITS, -(-kv_len // min_tokens)))
