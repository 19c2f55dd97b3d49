"""All of attention over the paged KV cache: one object per cache, a class per way of reading it.

paged.py: that object (`of`), its classes (the PyTorch reference, SDPA over a gathered copy, the
Triton kernel reading the blocks in place) and the one call for a pass of rows; the split
algorithm, its reference and the kernel's load check (decode_attention.py); windowed and
soft-capped attention (sliding_window.py); the attention function transformers' modules call
(prefill.py). The Triton programs themselves sit in kernels/ (decode_attention_kernel.py).
"""
