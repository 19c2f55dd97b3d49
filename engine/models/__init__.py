"""The per-family decode step (Llama/Qwen layers) and its fused pieces."""
