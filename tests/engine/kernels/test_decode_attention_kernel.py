"""The decode-attention kernel in Triton's CPU interpreter (where Triton is
installed; CI has none, the GPU tests in test_quantized_kv.py run it compiled): against the
PyTorch reference, and its "consistent" setting, under which a query row computes the same bits
as a one-token step and inside a verify block (the synthetic draft's acceptance depends on it),
and prefill chunks of lengths that are not multiples of the kernel's row tile."""

from __future__ import annotations

from tests.engine.helpers import INTERPRETER, interpreted

CHECK = r"""
import numpy as np
import torch
from triton.runtime import interpreter

# The interpreter's tl.dot is numpy's matmul, and OpenBLAS computes a row differently by its place
# in the matrix on some CPUs (AMD EPYC: rows 2 and 10 of one product differ in the last bits),
# where a tensor core gives every output element the same reduction. The "consistent" promise is
# about the kernel's arithmetic, not the BLAS: here each element is summed over k alike.
_matmul = interpreter.InterpreterBuilder.create_dot
def _dot_by_element(self, a, b, d, input_precision, max_num_imprecise_acc):
    if a.dtype.primitive_bitwidth == 8 or b.dtype.primitive_bitwidth == 8:
        return _matmul(self, a, b, d, input_precision, max_num_imprecise_acc)
    out = d.data.dtype
    prods = a.data.astype(out)[:, :, None] * b.data.astype(out)[None, :, :]  # [M, K, N]
    return interpreter.TensorHandle(prods.sum(axis=1, dtype=out) + d.data, d.dtype.scalar)
interpreter.InterpreterBuilder.create_dot = _dot_by_element

from engine.attention import decode_attention
from engine.kernels import decode_attention_kernel
from engine.cache.kv_cache import KVCache

torch.set_num_threads(1)  # the reference's sums in one order, run to run
Hkv, G, D, L, kv_len = 2, 3, 64, 1024, 1024
for kv_dtype in ("fp32", "int8"):
    cache = KVCache(1, Hkv, D, L, kv_dtype, "cpu")
    cache.reserve(700)  # blocks for the positions written
    g = torch.Generator().manual_seed(0)
    cache.write(0, torch.arange(700), torch.randn(1, Hkv, 700, D, generator=g),
                torch.randn(1, Hkv, 700, D, generator=g))
    kv = cache.layer(0)
    q = torch.randn(1, Hkv * G, 5, D, generator=g)
    pos = torch.arange(511, 516)  # split per pass, a one-token step at 511 and this block differ
    for cfg in ({"consistent": False}, {}, {"block_m": 64}, {"chunk": 0},
                {"chunk": 4, "block_n": 32}):  # the default: consistent
        block = decode_attention_kernel.decode_attention(q, kv, pos, kv_len, D ** -0.5, cfg)
        ref = decode_attention.reference(q, kv, pos, kv_len, D ** -0.5)
        err = ((block - ref).norm() / ref.norm()).item()
        assert err < 1e-5, (kv_dtype, cfg, err)
        for t in range(5):  # each row of the block against a one-token step at its position
            single = decode_attention_kernel.decode_attention(q[:, :, t:t + 1], kv, pos[t:t + 1],
                                                              kv_len, D ** -0.5, cfg)
            same = torch.equal(single[:, :, 0], block[:, :, t])
            if cfg.get("consistent", True):
                assert same, (kv_dtype, t, "a row's bits changed with the rows beside it")
            elif t == 0:
                assert not same, (kv_dtype, "per-pass splits: the check would not see a change")
    for T, start in ((37, 300), (100, 600)):  # prefill chunks: 111 and 300 rows, tiles of 64
        qp = torch.randn(1, Hkv * G, T, D, generator=g)
        pp = torch.arange(start, start + T)
        got = decode_attention_kernel.decode_attention(qp, kv, pp, kv_len, D ** -0.5)
        ref = decode_attention.reference(qp, kv, pp, kv_len, D ** -0.5)
        assert got.shape == qp.shape and got.is_contiguous()
        err = ((got - ref).norm() / ref.norm()).item()
        assert err < 1e-5, (kv_dtype, T, err)
print("ok")
"""


@INTERPRETER
def test_kernel_in_the_interpreter():
    interpreted(CHECK)
