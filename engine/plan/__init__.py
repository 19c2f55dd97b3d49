"""The memory planner: what fits in this card's VRAM, before loading (no torch)."""
