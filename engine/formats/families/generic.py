"""Families Hearth loads and runs through transformers' own modules (no fast path, no tensor
parallelism, no AWQ quantizer): Phi-3 fuses its projections, Gemma ties and scales its
embedding."""

from __future__ import annotations

from engine.formats.families.registry import Family, SamplingPreset

# greedy, as Phi-3's model card generates; Gemma's cards name no sampling: the engine's defaults
PHI3 = Family("phi3", "Phi-3", ("Phi3ForCausalLM",), gguf_architecture="phi3",
              sampling=SamplingPreset(temperature=0.0))
GEMMA = Family("gemma", "Gemma", ("GemmaForCausalLM",), tied_by_default=True)

FAMILIES = (PHI3, GEMMA)
