"""Attention over the paged cache: prefill through SDPA, decode through the kernels."""
