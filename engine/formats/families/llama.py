"""Llama, and Mistral (Llama's layout; its sliding window is the planner's rule for any family):
the module names the Qwen families share."""

from __future__ import annotations

from engine.formats.families.registry import Family, ModuleNames, SamplingPreset

LLAMA_NAMES = ModuleNames(
    layers="model.layers", embed="model.embed_tokens", norm="model.norm",
    rotary="model.rotary_emb", lm_head="lm_head", attn="self_attn",
    q="self_attn.q_proj", k="self_attn.k_proj", v="self_attn.v_proj", o="self_attn.o_proj",
    q_norm="self_attn.q_norm", k_norm="self_attn.k_norm",
    gate="mlp.gate_proj", up="mlp.up_proj", down="mlp.down_proj",
    ln_in="input_layernorm", ln_post="post_attention_layernorm")

# Llama 3's own generation_config.json says 0.6 / 0.9 and wins where present; this is for the
# folders without one (GGUF imports, SmolLM2): SmolLM2's model card's temperature 0.2, top-p 0.9
# (at 0.7 it answered in French more often than not)
LLAMA = Family(
    "llama", "Llama", ("LlamaForCausalLM",), gguf_architecture="llama", names=LLAMA_NAMES,
    fast_path=True, tensor_parallel=True, awq=True,
    sampling=SamplingPreset(temperature=0.2, top_p=0.9))
# a low temperature, as Mistral NeMo's model card asks (0.3)
MISTRAL = Family(
    "mistral", "Mistral", ("MistralForCausalLM",), gguf_architecture="mistral",
    names=LLAMA_NAMES, fast_path=True, tensor_parallel=True, awq=True,
    sampling=SamplingPreset(temperature=0.3, top_p=0.9))

FAMILIES = (LLAMA, MISTRAL)
