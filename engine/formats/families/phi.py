"""Phi-3 and Phi-4 (Phi3ForCausalLM) on the engine's own step: Llama's math with [q; k; v] in one
linear and [gate; up] in another, the fused weights the step reads anyway. Partial rotary
embeddings and RoPE that changes with the sequence's length (Phi-3.5's and Phi-4-mini's longrope)
decode through transformers' modules (models/step_weights.py supports)."""

from __future__ import annotations

from engine.formats.families.llama import LLAMA_NAMES
from engine.formats.families.registry import Family, ModuleNames, SamplingPreset

PHI3_NAMES = ModuleNames(**{**LLAMA_NAMES.__dict__, "q": "self_attn.qkv_proj", "k": "", "v": "",
                            "gate": "mlp.gate_up_proj", "up": ""})

# greedy, as Phi-3's model card generates
PHI3 = Family("phi3", "Phi-3", ("Phi3ForCausalLM",), gguf_architecture="phi3", names=PHI3_NAMES,
              fast_path=True, sampling=SamplingPreset(temperature=0.0))

FAMILIES = (PHI3,)
