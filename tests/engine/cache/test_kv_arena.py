"""kv_arena.py against a flat cache (the static layout the engine ran on before the arena: one
[1, H_kv, L, D] buffer a layer, written by position): the same writes (prefill chunks, single
steps, verify blocks, rewrites after a crop) read back bit for bit through a shuffled block
table, in every KV dtype; shared blocks are not disturbed by a sequence writing past them."""

from __future__ import annotations

import pytest
import torch

from engine.attention import decode_attention
from engine.cache import kv_arena
from engine.cache.kv_arena import STORAGE, KVArena
from engine.cache.kv_cache import LayerKV
from engine.kernels import kv_quant

LAYERS, H_KV, D, B, MAX_LEN, NUM_BLOCKS = 2, 2, 64, 4, 40, 14  # D: two scale groups
KV_DTYPES = ("fp32", "bf16", "int8", "fp8")


class Flat:
    """The oracle: per layer k, v [1, H_kv, L, D] (+ scales [1, H_kv, L, 2]) written by position."""

    def __init__(self, kv: str, length: int):
        dtype, self.quantized = STORAGE[kv], kv in kv_quant.STORAGE
        new = lambda: [torch.zeros(1, H_KV, length, D, dtype=dtype) for _ in range(LAYERS)]
        self.k, self.v = new(), new()
        ones = lambda: [torch.ones(1, H_KV, length, 2, dtype=torch.float16)
                        for _ in range(LAYERS)]
        self.k_scale, self.v_scale = (ones(), ones()) if self.quantized else ([None] * LAYERS,) * 2

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v + self.k_scale
                   + self.v_scale if t is not None)

    def write(self, layer, positions, k, v):
        for values, scales, x in ((self.k[layer], self.k_scale[layer], k),
                                  (self.v[layer], self.v_scale[layer], v)):
            if scales is None:
                values.index_copy_(2, positions, x.to(values.dtype))
                continue
            q, s = kv_quant.quantize(x, values.dtype)  # q: [1, H_kv, T, D], s: [1, H_kv, T, 2]
            if values.dtype is not torch.int8:  # no index_copy_ for fp8: copy its bytes
                values, q = values.view(torch.uint8), q.view(torch.uint8)
            values.index_copy_(2, positions, q)
            scales.index_copy_(2, positions, s)

    def read(self, layer, end, dtype):
        out = []
        for x, s in ((self.k[layer], self.k_scale[layer]), (self.v[layer], self.v_scale[layer])):
            x = x[:, :, :end]
            out.append(x.to(dtype) if s is None else kv_quant.dequantize(x, s[:, :, :end], dtype))
        return out

    def layer(self, i) -> LayerKV:
        """The flat buffers are an arena of one block of L tokens: table [0]."""
        return LayerKV(self.k[i], self.v[i], self.k_scale[i], self.v_scale[i],
                       torch.zeros(1, dtype=torch.int32))


def pair(kv: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    static = Flat(kv, MAX_LEN)
    arena = KVArena(LAYERS, H_KV, D, NUM_BLOCKS, B, kv, "cpu")
    table = torch.randperm(NUM_BLOCKS, generator=g)[:MAX_LEN // B].to(torch.int32)
    return static, arena, table, g


def write_both(static, arena, table, g, start: int, num: int) -> None:
    positions = torch.arange(start, start + num)
    for layer in range(LAYERS):
        k, v = (torch.randn(1, H_KV, num, D, generator=g) * 3 for _ in range(2))
        static.write(layer, positions, k, v)
        arena.write(layer, table, positions, k, v)


@pytest.mark.parametrize("kv", KV_DTYPES)
def test_arena_reads_what_the_static_cache_reads(kv):
    static, arena, table, g = pair(kv)
    # a prefill chunk crossing blocks, single steps, a verify block, then a crop and rewrite
    for start, num in ((0, 13), (13, 1), (14, 1), (15, 5), (20, 7), (17, 6)):
        write_both(static, arena, table, g, start, num)
    # position 5 sits in the block the table names second, at slot 1
    assert torch.equal(arena.k[1][table[1], :, 1].view(torch.uint8),
                       static.k[1][0, :, 5].view(torch.uint8))
    for layer in range(LAYERS):
        for end in (1, 4, 13, 23):
            a = arena.gather(layer, table, end, torch.float32)
            s = static.read(layer, end, torch.float32)
            for x, y in zip(a, s, strict=True):
                assert x.shape == (1, H_KV, end, D)
                assert torch.equal(x, y.float())


@pytest.mark.parametrize("kv", KV_DTYPES)
def test_decode_attention_over_the_gathered_arena_matches_the_static_cache(kv):
    static, arena, table, g = pair(kv, seed=1)
    write_both(static, arena, table, g, 0, 30)
    q = torch.randn(1, 2 * H_KV, 3, D, generator=g)  # a verify block of 3 at positions 27..29
    pos = torch.arange(27, 30)
    for layer in range(LAYERS):
        scales = (arena.k_scale[layer], arena.v_scale[layer]) if arena.quantized else (None,) * 2
        paged = decode_attention.reference(
            q, LayerKV(arena.k[layer], arena.v[layer], *scales, table), pos, 30, D ** -0.5,
            split=8)
        flat = decode_attention.reference(q, static.layer(layer), pos, 30, D ** -0.5, split=8)
        assert torch.equal(paged, flat)


def test_a_sequence_writing_past_shared_blocks_leaves_them_alone():
    _, arena, _, g = pair("int8")
    shared = [5, 9]  # two full blocks of a common system prompt
    table_a = torch.tensor([*shared, 2, 0], dtype=torch.int32)
    table_b = torch.tensor([*shared, 7, 11], dtype=torch.int32)
    k, v = (torch.randn(1, H_KV, 12, D, generator=g) for _ in range(2))
    arena.write(0, table_a, torch.arange(12), k, v)
    before = arena.gather(0, table_a, 12, torch.float32)
    k2, v2 = (torch.randn(1, H_KV, 6, D, generator=g) for _ in range(2))
    arena.write(0, table_b, torch.arange(8, 14), k2, v2)  # b's own blocks only
    after = arena.gather(0, table_a, 12, torch.float32)
    b = arena.gather(0, table_b, 14, torch.float32)
    for x, y, z in zip(before, after, b, strict=True):
        assert torch.equal(x, y)
        assert torch.equal(z[:, :, :8], x[:, :, :8])  # the shared prefix, read by both


@pytest.mark.parametrize("kv", KV_DTYPES)
def test_bytes_per_block_sizes_the_arena(kv):
    arena = KVArena(LAYERS, H_KV, D, NUM_BLOCKS, B, kv, "cpu")
    assert arena.num_bytes == NUM_BLOCKS * KVArena.bytes_per_block(LAYERS, H_KV, D, B, kv)
    static = Flat(kv, NUM_BLOCKS * B)
    assert arena.num_bytes == static.num_bytes  # the same bytes a token, laid out in blocks


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_dequantizing_in_chunks_gives_the_same_bits_as_at_once(kv):
    """The prefill's dequantized copy is made a few blocks at a time (memory); elementwise
    arithmetic, so every chunk size gives the bits of the whole-tensor dequantization."""
    B, n = 4, 11
    arena = KVArena(1, 2, 8, n + 3, B, kv, "cpu")
    table = torch.randperm(n + 3, generator=torch.Generator().manual_seed(0))[:n].to(torch.int32)
    x = torch.randn(1, 2, n * B, 8, generator=torch.Generator().manual_seed(1)) * 3
    arena.write(0, table, torch.arange(n * B), x, -x)
    end = n * B - 3  # inside the last block
    whole = kv_quant.dequantize(kv_arena.contiguous(arena.k[0], table, end),
                                kv_arena.contiguous(arena.k_scale[0], table, end), torch.bfloat16)
    for chunk in (1, 3, n, 100):
        got = kv_arena.dequantized(arena.k[0], arena.k_scale[0], table, end, torch.bfloat16, chunk)
        assert got.shape == whole.shape == (1, 2, end, 8) and torch.equal(got, whole), chunk
