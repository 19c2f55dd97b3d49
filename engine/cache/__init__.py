"""The paged KV cache: blocks and prefix sharing, the arena, per-layer views."""
