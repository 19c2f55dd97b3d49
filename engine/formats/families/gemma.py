"""Gemma 2 and Gemma 3 on the engine's own step: Llama's projections, with four norms a layer
(around attention and around the MLP), each scaling by (1 + weight); Gemma 3's RMSNorm over each
q and k head; the embedding scaled by sqrt(hidden); GELU (tanh) gating; and sliding-window layers
between global ones, each kind with its own RoPE base in Gemma 3. Gemma 3's 4B-27B checkpoints
are Gemma3ForConditionalGeneration: the loader takes their language model and leaves the vision
tower on disk. Gemma 2 soft-caps its attention logits (computed without SDPA:
attention/sliding_window.py)."""

from __future__ import annotations

from engine.formats.families.llama import LLAMA_NAMES
from engine.formats.families.registry import Family, ModuleNames

# ln_post: the norm before the MLP (Gemma's pre_feedforward_layernorm); the norms after
# attention and after the MLP are Gemma's own (models/gemma_step.py reads them)
GEMMA3_NAMES = ModuleNames(**{**LLAMA_NAMES.__dict__, "ln_post": "pre_feedforward_layernorm"})
GEMMA3_POST_ATTENTION = "post_attention_layernorm"
GEMMA3_POST_MLP = "post_feedforward_layernorm"

GEMMA3_TEXT = Family(
    "gemma3_text", "Gemma 3", ("Gemma3ForCausalLM",), gguf_architecture="gemma3",
    names=GEMMA3_NAMES, fast_path=True,
    qk_norm=True, tied_by_default=True, sliding_layers=True, layer_norms=4)
# the multimodal checkpoints: their language model loads as Gemma3ForCausalLM (load/loader.py)
GEMMA3 = Family("gemma3", "Gemma 3 (multimodal)", ("Gemma3ForConditionalGeneration",),
                qk_norm=True, tied_by_default=True, sliding_layers=True, layer_norms=4)

GEMMA2 = Family(
    "gemma2", "Gemma 2", ("Gemma2ForCausalLM",), names=GEMMA3_NAMES, fast_path=True,
    tied_by_default=True, sliding_layers=True, layer_norms=4)

FAMILIES = (GEMMA3_TEXT, GEMMA3, GEMMA2)


def local_layers(c: dict, num_layers: int) -> int:
    """Layers of a sliding-window family that attend within the window: config.json's
    layer_types, else transformers' rule (Gemma 3: all but every sliding_window_pattern-th,
    default 6; Gemma 2: every other one, from the first)."""
    types = c.get("layer_types")
    if isinstance(types, list) and len(types) == num_layers:
        return sum(t == "sliding_attention" for t in types)
    pattern = c.get("sliding_window_pattern")
    if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 1:
        pattern = 2 if str(c.get("model_type")) == "gemma2" else 6
    return sum(bool((i + 1) % pattern) for i in range(num_layers))
