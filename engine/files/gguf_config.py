"""What transformers' GGUF reader leaves out of a family's config, read back from the file as
llama.cpp reads it. Gemma 3: the global layers' RoPE scaling (gemma3.rope.scaling.type and
.factor: linear x8 on the 4B-27B checkpoints; the local layers keep base 10,000 unscaled), and
query_pre_attn_scalar, which a GGUF does not state: llama.cpp scales queries by head_dim, or by
hidden / heads on the 27B (62 layers). Without these an import runs, but not as the file's
model. No torch here."""

from __future__ import annotations

from collections.abc import Callable

GEMMA3_27B_LAYERS = 62  # how llama.cpp tells the 27B apart (its query scale differs)


def gemma3(field: Callable[[str], object], config: dict) -> dict:
    """Settings to lay over the config transformers built from a gemma3 GGUF."""
    changes: dict = {}
    layers, heads = config.get("num_hidden_layers"), config.get("num_attention_heads")
    if layers == GEMMA3_27B_LAYERS and heads:
        changes["query_pre_attn_scalar"] = config["hidden_size"] // heads
    elif config.get("head_dim"):
        changes["query_pre_attn_scalar"] = config["head_dim"]
    kind, factor = field("gemma3.rope.scaling.type"), field("gemma3.rope.scaling.factor")
    rope = config.get("rope_parameters")
    if kind == "linear" and isinstance(factor, int | float) and factor > 0 and isinstance(
            rope, dict) and isinstance(rope.get("full_attention"), dict):
        full = {**rope["full_attention"], "rope_type": "linear", "factor": float(factor)}
        changes["rope_parameters"] = {**rope, "full_attention": full}
    return changes


# GGUF general.architecture -> what to change in its transformers config
FIXES: dict[str, Callable[[Callable[[str], object], dict], dict]] = {"gemma3": gemma3}
