"""The one call over the paged arena (attention/paged.py) in Triton's CPU interpreter: a pass of
a decode row, a verify row and a prefill chunk of three sequences, each through its own shuffled
block table in one arena, with and without a sliding window; each implementation (SDPA for a
16-bit-or-wider cache, the Triton kernel for every cache) gives the reference's output, and so
does the batched decode step's entry point. The cache's own object is chosen once, by its path."""

from __future__ import annotations

from tests.engine.helpers import INTERPRETER, interpreted

CHECK = r"""
import torch
from engine.attention import decode_attention, paged
from engine.cache.kv_cache import KVCache

torch.set_num_threads(1)
H, Hkv, D = 6, 2, 32
rows = [(37, 38, 48), (20, 25, 32), (30, 42, 48)]  # (first, end, bucket): decode, verify, chunk
for kv_dtype, kinds in (("fp32", (paged.Sdpa, paged.Triton)), ("int8", (paged.Triton,))):
    cache = KVCache(1, Hkv, D, 48, kv_dtype, "cpu", num_blocks=9)
    assert paged.of(cache) is paged.of(cache)  # one object per cache, by its path on a CPU
    assert type(paged.of(cache)) is (paged.Sdpa if kv_dtype == "fp32" else paged.Reference)
    g = torch.Generator().manual_seed(0)
    tables = torch.randperm(9, generator=g).to(torch.int32).view(3, 3)  # 3 blocks of 16 each
    for i, (_, end, _) in enumerate(rows):
        cache.arena.write(0, tables[i], torch.arange(end), torch.randn(1, Hkv, end, D, generator=g),
                          torch.randn(1, Hkv, end, D, generator=g))
    kv = cache.layer(0)
    pos = torch.cat([torch.arange(a, b) for a, b, _ in rows])
    spans, lo = [], 0
    for i, (a, b, L) in enumerate(rows):
        spans.append(paged.Row(lo, lo + b - a, L, tables[i]))
        lo += b - a
    q = torch.randn(1, H, lo, D, generator=g)
    reference = paged.Reference(cache)
    for window in (None, 8):
        ref = reference.over(pos, spans, D ** -0.5, window)(q, kv)
        assert ref.shape == (1, lo, H * D)
        r = spans[2]  # the chunk alone, as its own pass reads it
        alone = decode_attention.reference(q[:, :, r.lo:r.hi], kv._replace(table=r.table),
                                           pos[r.lo:r.hi], r.kv_len, D ** -0.5)
        if window is None:
            assert torch.equal(ref[:, r.lo:r.hi], paged.tokens_major(alone))
        else:  # the window reaches back 8 keys: the chunk's rows change
            assert not torch.allclose(ref[:, r.lo:r.hi], paged.tokens_major(alone), atol=1e-3)
        for kind in kinds:
            got = kind(cache).over(pos, spans, D ** -0.5, window)(q, kv)
            err = ((got - ref).norm() / ref.norm()).item()
            assert err < 1e-5, (kv_dtype, kind.name, window, err)
    # the batched decode step: one token of each sequence, each over its own bucket
    step_pos = torch.tensor([b - 1 for _, b, _ in rows])
    lens = [L for _, _, L in rows]
    qs = torch.randn(1, H, 3, D, generator=g)
    for kind in kinds:
        att = kind(cache)
        batch = decode_attention.BatchRows(tables, torch.tensor(lens, dtype=torch.int32),
                                           torch.tensor([att.splits(L) for L in lens],
                                                        dtype=torch.int32), max(lens), tuple(lens))
        ref = reference.batch(step_pos, batch, D ** -0.5)(qs, kv._replace(table=tables))
        got = att.batch(step_pos, batch, D ** -0.5)(qs, kv._replace(table=tables))
        err = ((got - ref).norm() / ref.norm()).item()
        assert err < 1e-5, (kv_dtype, kind.name, "batch", err)
print("ok")
"""


@INTERPRETER
def test_each_implementation_gives_the_reference_for_a_mixed_pass():
    interpreted(CHECK)
