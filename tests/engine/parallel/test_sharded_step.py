"""The sharded step at world size 1 (rank 0 of 1's cut, its all-reduce after o and down and its
vocabulary gather, over a one-rank process group) against the plain step (FamilyStep over the
whole model): the same bits for prefill chunks, decode steps and a verify block, on CPU in fp32
and bf16 (gloo), and on a GPU in bf16 (NCCL, fused pieces and CUDA graphs) where there is one."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import transformers

from engine.cache.kv_cache import KVCache
from engine.models import fused_ops
from engine.models.layers import FamilyStep
from engine.parallel.sharded_step import rank_step, shard, spec_of
from engine.step.decode import Decoder, kv_buckets

CONTEXT = 320  # two KV buckets: 256 and 320
SIZES = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16)
CONFIGS = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig,
           "qwen3": transformers.Qwen3Config}
KV_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def _model(arch: str, dtype: torch.dtype, device: str):
    torch.manual_seed(0)
    tied = dict(tie_word_embeddings=arch != "llama")  # both lm_head layouts
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[arch](**SIZES, **tied),
                                                          dtype=dtype).eval()
    for m in model.modules():  # transformers starts biases and norms at 0 and 1: draw them
        if isinstance(m, torch.nn.Linear) and m.bias is not None:
            torch.nn.init.normal_(m.bias, std=0.1)
        elif "RMSNorm" in type(m).__name__:
            torch.nn.init.normal_(m.weight, 1.0, 0.1)
    return model.to(device)


@contextmanager
def _one_rank_group(device: torch.device):
    if device.type == "cuda":
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=device)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _steps(arch: str, dtype: torch.dtype, device: torch.device) -> tuple[FamilyStep, FamilyStep]:
    """(the sharded step of rank 0 of 1, the plain step), each over its own fresh cache."""
    model = _model(arch, dtype, str(device))
    spec = replace(spec_of(model, 2, CONTEXT, KV_NAMES[dtype]), world_size=1,
                   buckets=tuple(kv_buckets(CONTEXT)))
    cache = lambda: KVCache(2, 2, 16, CONTEXT, dtype, device)
    # the cut first: the plain step fuses q/k/v and gate/up of the model in place
    sharded = rank_step(spec, 0, dict(shard(model, spec, 0, device)), cache())
    plain = FamilyStep.of(model, cache())
    assert sharded.shard.world_size == 1 and sharded.reduce is not None and plain.reduce is None
    assert (sharded.num_heads, sharded.num_kv_heads) == (plain.num_heads, plain.num_kv_heads)
    return sharded, plain


def _same_passes(a: Decoder, b: Decoder, device: torch.device) -> None:
    """Two prefill chunks (the second attends to the first's K/V), decode steps across the
    256 bucket's edge, then a verify block: every logit bit for bit."""
    ids = torch.randint(3, 256, (262,), generator=torch.Generator().manual_seed(5)).to(device)
    for lo, hi in ((0, 200), (200, 250)):
        assert torch.equal(a.forward(ids[lo:hi], lo), b.forward(ids[lo:hi], lo))
    for pos in range(250, 262):
        tok = ids[pos:pos + 1]
        x, y = a.step(tok, pos), b.step(tok, pos)
        assert x.shape == (256,) and torch.equal(x, y), pos
    x, y = a.verify(ids[255:259], 262), b.verify(ids[255:259], 262)
    assert x.shape == (4, 256) and torch.equal(x, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_world_size_1_is_the_plain_step_bitwise_on_cpu(arch, dtype):
    cpu = torch.device("cpu")
    with _one_rank_group(cpu):
        sharded, plain = _steps(arch, dtype, cpu)
        _same_passes(Decoder(None, sharded.cache, cpu, family=sharded),
                     Decoder(None, plain.cache, cpu, family=plain), cpu)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_world_size_1_is_the_plain_step_bitwise_on_a_gpu(arch):
    """As on one GPU: the fused pieces where they run, the decode kernel, captured graphs."""
    gpu = torch.device("cuda", 0)
    with _one_rank_group(gpu):
        sharded, plain = _steps(arch, torch.bfloat16, gpu)
        notes = [fused_ops.prepare(s, gpu, compile_layers=False) for s in (sharded, plain)]
        assert notes[0] == notes[1]  # the same pieces on both
        decoders = [Decoder(None, s.cache, gpu, family=s) for s in (sharded, plain)]
        for d in decoders:
            d.capture()  # NCCL's one-rank sum inside the graph
            assert d.mode == "graph"
        _same_passes(*decoders, gpu)
        for d in decoders:
            d.graphs.clear()  # NCCL's teardown waits until no graph holds one of its ops


def test_a_rank_runs_rank_0s_backends_not_its_environment(monkeypatch):
    """A follower builds its cache and step from the Backends rank 0 sent with the spec: its
    own environment's overrides (HEARTH_*) change nothing."""
    from engine.config.backends import Backends
    from engine.parallel.follower import Rank

    monkeypatch.setenv("HEARTH_DECODE_ATTENTION", "sdpa")
    monkeypatch.setenv("HEARTH_FUSED_OPS", "off")
    model = _model("llama", torch.float32, "cpu")
    leaders = Backends(decode_attention="reference", kernel_prefill=64)
    spec = replace(spec_of(model, 2, CONTEXT, "fp32"), world_size=1,
                   buckets=tuple(kv_buckets(CONTEXT)), backends=leaders.to_json())
    cpu = torch.device("cpu")
    with _one_rank_group(cpu):
        rank = Rank(spec, 0, dict(shard(model, spec, 0, cpu)), cpu)
        assert rank.backends == leaders and rank.cache.backends == leaders
        assert type(spec).from_json(spec.to_json()).backends == spec.backends
        plain = Rank(replace(spec, backends=""), 0, dict(shard(model, spec, 0, cpu)), cpu)
        assert plain.cache.backends == Backends()  # the defaults, not HEARTH_DECODE_ATTENTION
