"""The planner's standing choice for a card, one definition that the planner and the app both
ask: the 16-bit dtype it computes in. Pure Python (the app imports it)."""

from __future__ import annotations

BF16_MIN_CC = (8, 0)  # Ampere: cards before it have no bf16 arithmetic


def sixteen_bit(compute_capability=None) -> str:
    """"bf16", or "fp16" on a card older than Ampere; "bf16" when the card is not known (the CPU,
    or a plan made without one)."""
    cc = tuple(compute_capability) if compute_capability else None
    return "fp16" if cc and cc < BF16_MIN_CC else "bf16"
