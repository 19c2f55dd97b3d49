"""Qwen2 and Qwen3: Llama's module names, with Qwen2's q/k/v biases (never in config.json) and
Qwen3's RMSNorm over each q and k head before RoPE."""

from __future__ import annotations

from engine.formats.families.llama import LLAMA_NAMES
from engine.formats.families.registry import Family, SamplingPreset

# the sampling presets: what Qwen2.5's and Qwen3's instruct models ship in generation_config.json,
# less Qwen2.5's repetition penalty (1.05): it also penalizes what should repeat (code, names),
# and the loop guard (generate/loop_guard.py) ends a real loop
QWEN2 = Family(
    "qwen2", "Qwen2", ("Qwen2ForCausalLM",), gguf_architecture="qwen2", names=LLAMA_NAMES,
    fast_path=True, tensor_parallel=True, awq=True, qkv_bias=True,
    sampling=SamplingPreset(temperature=0.7, top_p=0.8, top_k=20))
# the planner counts the head norms of Qwen3's relatives too (qwen3_moe, qwen3_vl_text, ...)
QWEN3 = Family(
    "qwen3", "Qwen3", ("Qwen3ForCausalLM",), gguf_architecture="qwen3", names=LLAMA_NAMES,
    fast_path=True, tensor_parallel=True, awq=True, qk_norm=True, planned_prefixes=("qwen3",),
    sampling=SamplingPreset(temperature=0.6, top_p=0.95, top_k=20))

FAMILIES = (QWEN2, QWEN3)
