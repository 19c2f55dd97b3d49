"""Mixtures of experts on the engine's own step: Qwen3-MoE and Mixtral, Qwen3's and Mistral's
attention with a router and routed experts in place of the MLP (models/moe_step.py). Neither has
shared experts. Qwen3-MoE renormalises its top-k weights where config.json's norm_topk_prob says
(Qwen3-30B-A3B does); Mixtral always does (a softmax over the top-k logits)."""

from __future__ import annotations

from engine.formats.families.llama import LLAMA_NAMES
from engine.formats.families.registry import Experts, Family, ModuleNames, SamplingPreset

# Llama's attention; no dense MLP: the router and experts are Experts' (models/experts.py)
MOE_NAMES = ModuleNames(**{**LLAMA_NAMES.__dict__, "gate": "", "up": "", "down": ""})

QWEN3_MOE = Family(
    "qwen3_moe", "Qwen3-MoE", ("Qwen3MoeForCausalLM",), names=MOE_NAMES, fast_path=True,
    qk_norm=True, experts=Experts(
        count_keys=("num_experts", "num_local_experts"), intermediate_key="moe_intermediate_size",
        normalize="norm_topk_prob",
        checkpoint=("mlp.experts.{e}.gate_proj", "mlp.experts.{e}.up_proj",
                    "mlp.experts.{e}.down_proj")),
    sampling=SamplingPreset(temperature=0.6, top_p=0.95, top_k=20))
MIXTRAL = Family(
    "mixtral", "Mixtral", ("MixtralForCausalLM",), names=MOE_NAMES, fast_path=True,
    experts=Experts(
        count_keys=("num_local_experts",), intermediate_key="intermediate_size", normalize="always",
        checkpoint=("block_sparse_moe.experts.{e}.w1", "block_sparse_moe.experts.{e}.w3",
                    "block_sparse_moe.experts.{e}.w2")),
    sampling=SamplingPreset(temperature=0.3, top_p=0.9))

FAMILIES = (QWEN3_MOE, MIXTRAL)
