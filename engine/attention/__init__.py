"""All of attention over the engine's KV cache: the one object per cache that every pass reads it
through, a class per way of reading it (paged.py: the PyTorch reference, SDPA over a gathered
copy, the Triton kernel reading the blocks in place), the split algorithm, its reference and
the kernel's load check (decode_attention.py), windowed and soft-capped attention
(sliding_window.py), and the attention function transformers' modules call (prefill.py). The
Triton programs themselves sit in kernels/ (decode_attention_kernel.py and its programs)."""
