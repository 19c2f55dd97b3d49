"""Families Hearth loads and runs through transformers' own modules (no fast path, no tensor
parallelism, no AWQ quantizer): Gemma ties and scales its embedding."""

from __future__ import annotations

from engine.formats.families.registry import Family

# Gemma's cards name no sampling: the engine's defaults
GEMMA = Family("gemma", "Gemma", ("GemmaForCausalLM",), tied_by_default=True)

FAMILIES = (GEMMA,)
