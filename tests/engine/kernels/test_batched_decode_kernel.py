"""The batched decode-attention kernel in Triton's CPU interpreter: N sequences of
different lengths (ends inside blocks, different buckets and so different split counts), each
through its own shuffled block table in one shared arena, in one launch. Each row must equal,
bit for bit, the kernel run for that sequence alone (its bucket, its splits), and the PyTorch
reference within the kernel tests' tolerance; fp32, fp16, int8 and fp8 caches. Then whole
generations of several requests at once, every decode step through the kernel, against each
request alone."""

from __future__ import annotations

import pytest
import torch

from engine.attention import decode_attention
from engine.cache.kv_arena import KVArena
from engine.cache.kv_cache import LayerKV
from engine.step.decode import bucket, kv_buckets
from tests.engine.helpers import INTERPRETER, interpreted


def case(kv, H, Hkv, D, lengths, B, seed, cfg=None, device="cpu"):
    from engine.kernels import decode_attention_kernel as kernel  # Triton: only where it runs

    g = torch.Generator().manual_seed(seed)
    buckets = kv_buckets(4096)
    need = [-(-n // B) for n in lengths]
    arena = KVArena(1, Hkv, D, sum(need) + 3, B, kv, device)
    order = torch.randperm(sum(need) + 3, generator=g).to(torch.int32)  # blocks out of order
    width = 4096 // B  # every bucket's blocks, as a cache's table holds
    table = torch.full((len(lengths) + 1, width), sum(need) + 2, dtype=torch.int32)
    at = 0
    for i, n in enumerate(lengths):
        table[i, :need[i]] = order[at:at + need[i]]
        at += need[i]
        k = torch.randn(1, Hkv, n, D, generator=g) * 2
        v = torch.randn(1, Hkv, n, D, generator=g)
        arena.write(0, table[i].to(device), torch.arange(n, device=device), k.to(device),
                    v.to(device))
    scales = (arena.k_scale[0], arena.v_scale[0]) if arena.quantized else (None, None)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(kv, torch.float16)
    q = torch.randn(1, H, len(lengths), D, generator=g).to(device, dtype)
    pos = torch.tensor([n - 1 for n in lengths], device=device)
    table = table.to(device)
    lens = [bucket(buckets, n) for n in lengths]
    splits = [kernel.splits_for(L, Hkv, torch.device(device), cfg, arena.quantized)
              for L in lens]
    assert len(set(splits)) > 1, splits  # rows that split their keys differently
    layer = LayerKV(arena.k[0], arena.v[0], *scales, table)
    out = kernel.batched_decode_attention(q, layer, pos, torch.tensor(lens, device=device),
                                          torch.tensor(splits, device=device), max(lens),
                                          D ** -0.5, cfg)
    assert out.shape == (1, len(lengths), H * D) and out.dtype == dtype
    for i in range(len(lengths)):
        one = layer._replace(table=table[i])
        alone = kernel.decode_attention(q[:, :, i:i + 1], one, pos[i:i + 1], lens[i], D ** -0.5,
                                        cfg)
        alone = alone.transpose(1, 2).reshape(1, H * D)
        assert torch.equal(out[:, i], alone), (kv, lengths, i)
        ref = decode_attention.reference(q[:, :, i:i + 1].float(), one, pos[i:i + 1], lens[i],
                                         D ** -0.5).transpose(1, 2).reshape(1, H * D)
        tol = 1e-5 if kv == "fp32" else 1e-2
        err = ((out[:, i].float() - ref).norm() / ref.norm()).item()
        assert err < tol, (kv, lengths, i, err)


SPLIT_256 = {"min_split": 256}  # two KV heads on the interpreter's 4 "SMs" want 4 splits, which
# every bucket from 256 keys has at 64 keys a split: at 256 the buckets split differently
CASES = [  # H, Hkv, D, lengths, B, launch settings
    (4, 1, 32, [1000, 7, 300, 513, 256], 16, None),  # buckets 1024 / 256 / 512 / 1024 / 256
    (8, 2, 16, [45, 600, 1, 2049], 16, SPLIT_256),  # one key; a bucket of 4,096
    (6, 2, 32, [130, 900], 64, SPLIT_256),  # blocks as long as the kernel's tile
    (4, 1, 64, [300, 45], 16, None),  # two scale groups a key (int8, fp8)
]


def run_cases(device: str = "cpu") -> None:
    """Every case in fp32, fp16, int8 and fp8 (bf16 too on a GPU: the interpreter computes it
    wrong, numpy having no bfloat16)."""
    kvs = ("fp32", "fp16", "int8", "fp8") + (("bf16",) if device == "cuda" else ())
    for kv in kvs:
        for i, (*c, cfg) in enumerate(CASES):
            case(kv, *c, seed=i, cfg=cfg, device=device)
    case("int8", *CASES[0][:-1], seed=9, cfg={"fp16_dots": True}, device=device)


KERNEL = """
from tests.engine.kernels.test_batched_decode_kernel import run_cases
run_cases("cpu")
print("ok")
"""


@INTERPRETER
def test_each_row_is_the_kernel_alone_bit_for_bit():
    interpreted(KERNEL)


GENERATIONS = """
import sys, threading
import torch
from engine.events import GenerateRequest, LoadRequest, SamplingParams, Token, Finished
from engine.generate.session import Session
from engine.service.engine import Engine
from engine.kernels import attention_backend

torch.set_num_threads(1)
attention_backend.choose = lambda *args: "triton"
session = Session.load(LoadRequest(sys.argv[1], device="cpu", kv_dtype=sys.argv[2]))
assert session.cache.decode_attention == "triton", session.cache.decode_attention
PROMPTS = ["The quick brown fox", "zipfile", "one two three four five six seven eight nine",
           "explains the module"]
def req(i):
    sampling = SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=i)
    return GenerateRequest(prompt=PROMPTS[i], raw=True, max_new_tokens=6 + 2 * i,
                           ignore_eos=True, sampling=sampling)
alone = [[t for e in session.generate(req(i)) if isinstance(e, Token) for t in e.token_ids]
         for i in range(len(PROMPTS))]
engine = Engine()
engine.session = session
thread = threading.Thread(target=engine.run, daemon=True)
thread.start()
got = {i: [] for i in range(len(PROMPTS))}
done = {i: threading.Event() for i in got}
def sink(i):
    def take(e):
        if isinstance(e, Token):
            got[i].extend(e.token_ids)
        elif isinstance(e, Finished):
            done[i].set()
    return take
for i in got:
    engine.submit(req(i), sink(i))
for i in got:
    assert done[i].wait(300)
assert max(engine.batch.rows_seen) >= 3, engine.batch.rows_seen  # steps of several rows ran
assert [got[i] for i in got] == alone, (got, alone)
engine.stop()
thread.join()
print("ok")
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_each_row_is_the_compiled_kernel_alone_bit_for_bit():
    run_cases("cuda")


@INTERPRETER
def test_batched_generations_through_the_kernel_match_each_alone(tiny_models):
    for kv in ("fp32", "int8"):
        interpreted(GENERATIONS, str(tiny_models["llama"]), kv)
