"""The Triton decode-attention kernel reading the paged arena through a shuffled block table,
against the PyTorch reference (which gathers the same blocks), in Triton's CPU interpreter: every
KV dtype the interpreter computes (fp32, fp16, int8, fp8, with one scale per key or per group
of its elements; it gets bf16 wrong for the unchanged
flat kernel too: numpy has no bfloat16, so bf16 is left to the GPU tests in test_quantized_kv),
contexts that end inside a block, queries that see part of the bucket, verify blocks crossing
block boundaries, and block sizes that differ from the kernel's tiles; then whole generations
whose every decode step and verify block reads the session's arena through the kernel."""

from __future__ import annotations

import pytest

from engine.config import overrides
from engine.step.decode import KERNEL_PREFILL, kernel_prefill
from tests.engine.helpers import INTERPRETER, interpreted

INTERPRETED = """
import torch
from engine.attention import decode_attention
from engine.kernels import decode_attention_kernel
from engine.cache.kv_arena import KVArena
from engine.cache.kv_cache import LayerKV

def case(kv, H, Hkv, D, T, kv_len, positions, B, seed, cfg=None):
    g = torch.Generator().manual_seed(seed)
    n = -(-kv_len // B)
    arena = KVArena(1, Hkv, D, n + 5, B, kv, "cpu")
    table = torch.randperm(n + 5, generator=g)[:n].to(torch.int32)  # blocks out of order
    size = torch.rand(1, Hkv, kv_len, 1, generator=g) * 4 + 0.01
    # the second half of a head's channels 8x the first: groups of a key with unlike scales
    channels = 1 + 7 * (torch.arange(D) >= D // 2)
    k = torch.randn(1, Hkv, kv_len, D, generator=g) * size * channels
    v = torch.randn(1, Hkv, kv_len, D, generator=g) * size
    arena.write(0, table, torch.arange(kv_len), k, v)
    scales = (arena.k_scale[0], arena.v_scale[0]) if arena.quantized else (None, None)
    layer = LayerKV(arena.k[0], arena.v[0], *scales, table)
    dtype = torch.float32 if kv == "fp32" else torch.float16
    q = torch.randn(1, H, T, D, generator=g).to(dtype)
    pos = torch.tensor(positions)
    out = decode_attention_kernel.decode_attention(q, layer, pos, kv_len, D ** -0.5, cfg)
    ref = decode_attention.reference(q.float(), layer, pos, kv_len, D ** -0.5)
    assert out.shape == (1, H, T, D) and out.dtype == dtype
    # fp32: IEEE dots, summation order only; 16-bit queries: P rounds to 16 bits for P V
    tol = 1e-5 if kv == "fp32" else 1e-2
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < tol, (kv, kv_len, positions, B, err)

CASES = [  # H, Hkv, D, T, kv_len, positions, B
    (8, 2, 32, 1, 300, [299], 16),  # the bucket ends inside a block
    (8, 2, 32, 1, 77, [50], 16),  # keys past the position are masked
    (4, 2, 16, 3, 600, [597, 598, 599], 16),  # splits (600 keys), a block boundary at 592
    (4, 1, 64, 5, 256, [14, 15, 16, 17, 18], 16),  # a verify block across blocks 0 and 1
    (8, 4, 32, 1, 130, [129], 64),  # blocks as long as the kernel's tile
    (4, 2, 16, 2, 45, [43, 44], 8),
    (4, 2, 64, 1, 300, [299], 16),  # two scale groups a key (32 and 16: one a key), splits
]
for kv in ("fp32", "fp16", "int8", "fp8"):
    for i, c in enumerate(CASES):
        case(kv, *c, seed=i)
for kv in ("int8", "fp8"):  # the codes widened to fp16 (int8 by bit operations), fp16 dots
    for i, c in enumerate(CASES):
        case(kv, *c, seed=i, cfg={"fp16_dots": True})
for kv, cfg in (("fp16", {"block_m": 16}), ("int8", {"block_m": 16}),
                ("int8", {"block_m": 16, "fp16_dots": True}), ("fp8", {"block_m": 16}),
                ("fp32", {"chunk": 0}), ("int8", {"chunk": 0, "block_n": 32}),
                ("fp32", {"chunk": 4, "block_n": 32}),
                ("int8", {"chunk": 4, "block_n": 32}), ("fp8", {"chunk": 8, "block_n": 64})):
    for i, c in enumerate(CASES):  # 16-row tiles: a verify block's rows over several programs;
        # the table read a tile at a time (chunk 0) and a chunk of blocks at a time (several
        # chunks a split, a last one partial)
        case(kv, *c, seed=i, cfg=cfg)
print("ok")
"""


GENERATIONS = """
import sys
import torch
from engine.events import GenerateRequest, LoadRequest, SamplingParams
from engine.generate.session import Session
from tests.engine.helpers import through_the_kernel

torch.set_num_threads(1)
path = sys.argv[1]
greedy = SamplingParams(temperature=0.0)
chat = GenerateRequest(prompt_ids=tuple(range(40, 75)), max_new_tokens=30, sampling=greedy)
tokens = lambda s, r: [i for e in s.generate(r) if hasattr(e, "token_ids") for i in e.token_ids]
for kv in ("fp32", "int8"):
    ref = Session.load(LoadRequest(path, device="cpu", kv_dtype=kv))
    s = Session.load(LoadRequest(path, device="cpu", kv_dtype=kv))
    spec = Session.load(LoadRequest(path, device="cpu", kv_dtype=kv, draft=path,
                                    num_speculative_tokens=3))  # itself: verify blocks of 4
    spec.adaptive = spec.switch_off = False
    assert s.decoder.mode == "static"
    want = tokens(ref, chat)
    with through_the_kernel() as calls:
        got = [tokens(s, chat), tokens(spec, chat)]
    assert got == [want, want], (kv, got, want)
    assert {how for how, _ in calls} == {"triton"} and max(T for _, T in calls) > 1, calls[:5]
    assert 35 in {T for _, T in calls}, "the 35-token prompt, one short prefill through the kernel"
    if kv == "fp32":  # a next turn: 10 new tokens after the cached chat, against from scratch
        turn = GenerateRequest(prompt_ids=chat.prompt_ids + tuple(want) + tuple(range(80, 90)),
                               max_new_tokens=20, sampling=greedy)
        fresh = Session.load(LoadRequest(path, device="cpu", kv_dtype=kv))
        want = tokens(fresh, turn)  # 75 tokens: transformers' modules over a gathered copy
        with through_the_kernel() as calls:
            got = tokens(s, turn)
        assert got == want, (got, want)
        assert 0 < min(T for _, T in calls) and max(T for _, T in calls) <= 11, calls
print("ok")
"""


@INTERPRETER
def test_paged_kernel_equals_the_reference_in_the_interpreter():
    interpreted(INTERPRETED)


@INTERPRETER
def test_generations_through_the_kernel_equal_the_reference_paths(tiny_model):
    """fp32 and int8 caches, plain steps and a draft model's verify blocks, a prompt and answer
    over five blocks: greedy tokens equal those of the CPU paths (SDPA over a gathered copy for
    fp32, the PyTorch reference for int8), every decode attention going through the kernel."""
    interpreted(GENERATIONS, str(tiny_model))


LONG_PREFILL = """
import sys
import torch
from engine.events import GenerateRequest, LoadRequest, SamplingParams
from engine.generate.session import Session
from tests.engine.helpers import through_the_kernel

torch.set_num_threads(1)
path = sys.argv[1]
req = GenerateRequest(prompt_ids=tuple(range(40, 190)), max_new_tokens=4,
                      sampling=SamplingParams(temperature=0.0))
tokens = lambda s: [i for e in s.generate(req) if hasattr(e, "token_ids") for i in e.token_ids]
for kv in ("fp32", "int8"):
    want = tokens(Session.load(LoadRequest(path, device="cpu", kv_dtype=kv)))  # the modules
    s = Session.load(LoadRequest(path, device="cpu", kv_dtype=kv))
    with through_the_kernel() as calls:  # the default: a prompt within KERNEL_PREFILL tokens
        got = tokens(s)
    assert got == want, (kv, got, want)
    assert ("triton", 150) in calls, calls[:3]  # the whole prompt: one chunk through the kernel
print("ok")
"""


@INTERPRETER
def test_a_long_prefill_chunk_through_the_kernel_equals_the_modules(tiny_model):
    """By default a 150-token prompt is one chunk of the family step, its
    attention the kernel over fewer splits (a prefill's row tiles fill the GPU): greedy tokens
    equal those of transformers' modules, fp32 and int8."""
    interpreted(LONG_PREFILL, str(tiny_model))


def test_the_kernel_prefill_setting(monkeypatch):
    """HEARTH_KERNEL_PREFILL: unset is KERNEL_PREFILL, a number is that many tokens, all is any
    chunk; anything else is refused with the setting's name."""
    env = overrides.KERNEL_PREFILL
    assert kernel_prefill(overrides.backends({})) == KERNEL_PREFILL
    assert kernel_prefill(overrides.backends({env: "512"})) == 512
    assert kernel_prefill(overrides.backends({env: "all"})) > 10**9
    with pytest.raises(ValueError, match=env):
        overrides.backends({env: "lots"})
