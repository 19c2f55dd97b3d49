"""Model types the planner sizes but Hearth does not load (a Hub listing's fit, `hearth plan`):
only the facts that change their byte counts from the Llama-like default."""

from __future__ import annotations

from engine.formats.families.registry import Family

FAMILIES = (
    # transformers' defaults when config.json is silent
    Family("gpt2", "GPT-2", tied_by_default=True, gated_mlp=False),
    # one up projection, no gate
    *(Family(model_type, name, gated_mlp=False) for model_type, name in (
        ("gpt_neox", "GPT-NeoX"), ("phi", "Phi"), ("opt", "OPT"), ("falcon", "Falcon"),
        ("gpt_bigcode", "GPTBigCode"))),
)
