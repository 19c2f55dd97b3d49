"""kv_cache.KVCache, the paged cache the engine runs on: the block table keeps its address while
its entries follow the live sequence (captured graphs read it), writes past the reserved blocks
land in the scratch block and nowhere else, and reuse picks the live prefix or a cached one."""

from __future__ import annotations

import pytest
import torch

from engine.cache.kv_cache import KVCache

L, H_KV, D, B = 2, 2, 8, 4


def cache(max_len=32, num_blocks=None, kv="fp32") -> KVCache:
    return KVCache(L, H_KV, D, max_len, kv, "cpu", block_size=B, num_blocks=num_blocks)


def write(c: KVCache, start: int, end: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, H_KV, end - start, D, generator=g)
    for layer in range(L):
        c.write(layer, torch.arange(start, end), k, -k)
    return k


def table_matches(c: KVCache) -> bool:
    ids = c.seq.block_ids
    return c.table.tolist() == ids + [c.scratch] * (c.table.numel() - len(ids))


def test_the_table_keeps_its_address_and_follows_the_sequence():
    c = cache(num_blocks=12)
    address = c.table.data_ptr()
    assert table_matches(c) and c.scratch == 12 and c.arena.num_blocks == 13
    for end in (1, 4, 5, 13, 30):  # a step, a full block, a prefill chunk, ...
        c.reserve(end)
        write(c, end - 1, end, seed=end)
        assert table_matches(c) and len(c.seq.block_ids) == -(-end // B)
    c.token_ids = list(range(30))
    c.crop(9)  # an edit inside the third block
    assert table_matches(c) and len(c.seq.block_ids) == 3
    assert c.reuse(list(range(5)) + [99] * 20) == 5  # the live prefix
    assert table_matches(c)
    c.clear()
    assert table_matches(c) and not c.seq.block_ids and c.blocks.num_available == 12
    assert c.table.data_ptr() == address


@pytest.mark.parametrize("kv", ["fp32", "int8"])
def test_writes_past_the_reserved_blocks_land_in_the_scratch_block(kv):
    c = cache(kv=kv)
    c.reserve(10)
    k = write(c, 0, 10, seed=1)
    before = [t.clone() for t in c.k + c.v]
    write(c, 12, 15, seed=2)  # no reserve: graph warm-up, an eager test step
    for a, b in zip(before, c.k + c.v, strict=True):
        assert torch.equal(a[:c.scratch], b[:c.scratch])  # every real block as it was
        assert not torch.equal(a[c.scratch], b[c.scratch])
    got, _ = c.read(0, 10, torch.float32)
    tol = 0 if kv == "fp32" else 0.02 * k.abs().max().item()
    assert (got - k).abs().max().item() <= tol
    with pytest.raises(ValueError):
        c.reserve(33)


def test_reuse_takes_the_longer_of_the_live_and_the_cached_prefix():
    c = cache(max_len=64)
    system = list(range(100, 110))  # two full blocks and a half
    a, b = system + [1, 2, 3, 4, 5], system + [6, 7]
    assert c.reuse(a) == 0
    c.reserve(len(a))
    write(c, 0, len(a), seed=3)
    c.token_ids = list(a)
    blocks_a = list(c.seq.block_ids)
    assert c.reuse([7, 7, 7, 7, 7, 7]) == 0  # another chat: a's full blocks stay cached
    c.reserve(6)
    c.token_ids = [7] * 6
    assert c.reuse(b) == 8  # a's first two blocks by hash, the same blocks: no copy
    assert c.seq.block_ids[:2] == blocks_a[:2] and c.token_ids == b[:8]
    c.reserve(len(b) + 1)
    write(c, 8, len(b) + 1, seed=4)
    c.token_ids = b + [5]
    assert c.reuse(b + [5, 5, 5]) == 13  # the live chat: more than its 3 full blocks
    assert c.reuse(a[:-1] + [9]) == 12  # back to a: its third block as well, by hash
    assert c.seq.block_ids[:3] == blocks_a[:3] and c.token_ids == a[:12]
