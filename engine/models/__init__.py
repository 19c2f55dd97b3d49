"""The per-family step over the paged cache (layers.py: Llama, Qwen, Mistral, Phi-3; Gemma's
norms and windows, gemma_step.py; mixtures of experts, moe_step.py and experts.py), its weights
and fused pieces, a pass of several rows' chunks (prefill_batch.py), and the reproducible mode's
fixed tiles (invariant.py)."""
