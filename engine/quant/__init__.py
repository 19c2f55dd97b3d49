"""Quantized linear layers and formats: int4 (AWQ, tinygemm), int8, NF4, the lm_head."""
