"""Tensor parallelism on CPU: the cut (sharded_step.py) in one process, and two ranks over gloo
(follower.py: rank 0 here, rank 1 a child process) running rank 0's batched passes
(batch_ops.py) against the single-process step, fp32; a rank that fails ends them all."""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from engine.events import BadRequest, LoadRequest
from engine.generate.session import Session
from engine.models.prefill_batch import PassRow
from engine.parallel.batch_ops import RankBatch
from engine.parallel.leader import TPFailed, TPLeader, rank0_nccl_env
from engine.parallel.sharded_step import TPSpec, layout, shard, spec_of, vocab_rows
from engine.platform.child_env import NO_MULTICAST, child_env
from tests.engine.parallel.faults import FAIL_AT_STEP, inject

CONTEXT = 512


@pytest.fixture
def one_thread():
    """Two ranks share this machine's cores: intra-op threads spinning in both starve each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
    assert not dist.is_initialized()  # every leader leaves the group, failed or not


def _session(path) -> Session:
    return Session.load(LoadRequest(str(path), device="cpu", context=CONTEXT))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_the_cut_reassembles_the_model(arch, tiny_models):
    model = _session(tiny_models[arch]).lm.model
    spec = spec_of(model, 2, CONTEXT, "fp32")
    cuts = [dict(shard(model, spec, r, "cpu")) for r in range(2)]
    for w in cuts:  # exactly what a follower allocates and receives, in that order
        assert [(k, tuple(t.shape), t.dtype) for k, t in w.items()] == layout(spec)
    a, m = model.model.layers[1].self_attn, model.model.layers[1].mlp
    q, kv = 2 * spec.head_dim, spec.head_dim  # per rank: 2 query heads, 1 KV head
    qkv = [w["layers.1.qkv"] for w in cuts]
    assert torch.equal(torch.cat([t[:q] for t in qkv]), a.q_proj.weight)
    assert torch.equal(torch.cat([t[q:q + kv] for t in qkv]), a.k_proj.weight)
    assert torch.equal(torch.cat([t[q + kv:] for t in qkv]), a.v_proj.weight)
    assert torch.equal(torch.cat([w["layers.1.o"] for w in cuts], 1), a.o_proj.weight)
    assert torch.equal(torch.cat([w["layers.1.down"] for w in cuts], 1), m.down_proj.weight)
    half = spec.intermediate_size // 2
    assert torch.equal(torch.cat([w["layers.1.gate_up"][:half] for w in cuts]), m.gate_proj.weight)
    assert spec.tied == (arch != "llama") and spec.qkv_bias == (arch == "qwen2")
    assert spec.qk_norm == (arch == "qwen3")
    if not spec.tied:
        assert torch.equal(torch.cat([w["lm_head"] for w in cuts]), model.lm_head.weight)


def test_uneven_or_unsupported_cuts_are_bad_requests(tiny_models):
    model = _session(tiny_models["llama"]).lm.model  # 2 KV heads, intermediate 128
    for n in (3, 4):
        with pytest.raises(BadRequest, match="whole KV heads .* splits 2 ways"):
            spec_of(model, n, CONTEXT, "fp32")
    with pytest.raises(BadRequest, match="gemma"):
        spec_of(_session(tiny_models["gemma"]).lm.model, 2, CONTEXT, "fp32")


def test_rank_0_keeps_nccls_log_off_its_json_stdout():
    env = rank0_nccl_env({"NCCL_DEBUG": "WARN"})
    assert env["NCCL_DEBUG_FILE"] == "/dev/stderr" and NO_MULTICAST.items() <= env.items()
    assert rank0_nccl_env({"NCCL_DEBUG_FILE": "/tmp/n.%p"})["NCCL_DEBUG_FILE"] == "/tmp/n.%p"


def test_vocab_rows_pad_the_last_rank():
    spec = TPSpec(3, 1, 4, 2, 1, 2, 3, 10, 1e-6, 1.0, 1.0, "fp32", True, False, False, False,
                  16, "fp32", None, (16,))
    table = torch.randn(10, 4)
    rows = [vocab_rows(table, r, spec) for r in range(3)]
    assert [r.shape[0] for r in rows] == [4, 4, 4]
    assert torch.equal(torch.cat(rows)[:10], table) and not rows[2][2:].any()
    assert rows[0].data_ptr() == table.data_ptr()  # a view where no padding is needed


def test_child_environment_keeps_nvlink_multicast_off(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env = child_env()
    assert all(env[k] == v for k, v in NO_MULTICAST.items())
    assert NO_MULTICAST == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                            "NVSHMEM_DISABLE_NVLS": "1"}


def test_one_rank_step_keeps_the_o_proj_bias():
    """The sharded step's math in this process (a one-rank group): prefill and decode against
    transformers' modules, for a Llama with attention_bias (its o_proj bias is added once,
    after the all-reduce)."""
    import transformers

    from engine.attention import prefill as attention
    from engine.cache.kv_cache import KVCache
    from engine.parallel.sharded_step import rank_step
    from engine.step.decode import Decoder

    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, attention_bias=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    for layer in model.model.layers:
        torch.nn.init.normal_(layer.self_attn.o_proj.bias)
    attention.register()
    model.set_attn_implementation(attention.ATTN_IMPLEMENTATION)
    spec = replace(spec_of(model, 2, 64, "fp32"), world_size=1, buckets=(64,))
    assert spec.o_bias and spec.qkv_bias
    cache = KVCache(2, 2, 16, 64, torch.float32, "cpu")
    ref = Decoder(model, KVCache(2, 2, 16, 64, torch.float32, "cpu"), torch.device("cpu"))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        step = rank_step(spec, 0, dict(shard(model, spec, 0, "cpu")), cache)
        ids = torch.randint(3, 256, (20,), generator=torch.Generator().manual_seed(3))
        cache.reserve(20)  # the step writes at device positions: blocks first, as Rank does
        with torch.inference_mode():
            assert _rel(step.prefill(ids[:8], 0), ref.forward(ids[:8], 0)) < 1e-5
            for pos in range(8, 20):
                a = step(ids[pos:pos + 1], torch.tensor([pos]), 64)
                assert _rel(a, ref.step(ids[pos:pos + 1], pos)) < 1e-5
    finally:
        dist.destroy_process_group()


def _prefill(batch: RankBatch, ids: torch.Tensor, start: int, every: bool = False):
    """One chunk of rank 0's live sequence through every rank (a verify row where `every`)."""
    seq = batch.cache.seq
    chunk = PassRow(ids.tolist(), start, list(seq.block_ids), every)
    rows, _ = batch.prefill([chunk], [seq], together=every or None)
    return torch.stack(rows) if every else rows[0]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_two_ranks_equal_one_process(arch, tiny_models, one_thread):
    """Through rank 0's batched decoder, the only passes the ranks run: a prefill in two chunks,
    then 32 decode steps teacher-forced, then a verify row; rank 0's gathered logits against the
    single-process step (prefill: transformers' modules; decode and verify: FamilyStep)."""
    ref = _session(tiny_models[arch])
    assert ref.decoder.mode == "static"
    lead = TPLeader(ref.lm.model, 2, CONTEXT, "fp32", torch.device("cpu"))
    try:
        lead.setup_fast_path(allow_graph=True, compile_layers=False)
        assert lead.mode == "static" and lead.cache.max_len == CONTEXT
        assert lead.cache.k[0].shape[1:] == (1, lead.cache.block_size, 16)  # 1 of 2 KV heads
        batch = RankBatch(lead, lead.rank.decoder, 2)
        lead.cache.reserve(52)  # the blocks every rank writes: rank 0's
        ids = torch.randint(3, 2048, (48,), generator=torch.Generator().manual_seed(11))
        for lo, hi in ((0, 11), (11, 16)):  # the second chunk attends to the first one's K/V
            a, b = _prefill(batch, ids[lo:hi], lo), ref.decoder.forward(ids[lo:hi], lo)
            assert _rel(a, b) < 1e-5
        for pos in range(16, 48):
            a = batch.step([int(ids[pos])], [pos], [("s", lead.cache.seq)])[0]
            b = ref.decoder.step(ids[pos:pos + 1], pos)
            # fp32, partial sums added across ranks: far under 1e-5 relative to the logits' norm
            assert a.shape == b.shape == (2048,) and _rel(a, b) < 1e-5
            assert a.argmax() == b.argmax()
        # a verify row (speculative decoding): 4 tokens' logits, gathered row by row
        a, b = _prefill(batch, ids[40:44], 48, every=True), ref.decoder.verify(ids[40:44], 48)
        assert a.shape == b.shape == (4, 2048) and _rel(a, b) < 1e-5
    finally:
        lead.close()
    assert all(p.returncode == 0 for p in lead._procs.values())


def _leader(tiny_models) -> TPLeader:
    return TPLeader(_session(tiny_models["qwen2"]).lm.model, 2, CONTEXT, "fp32", "cpu")


def _decode(lead: TPLeader, n: int, batch: RankBatch | None = None) -> None:
    batch = batch or RankBatch(lead, lead.rank.decoder, 2)
    lead.cache.reserve(8 + n)
    _prefill(batch, torch.arange(3, 11), 0)
    for pos in range(8, 8 + n):
        batch.step([pos + 5], [pos], [("s", lead.cache.seq)])


def test_a_rank_that_raises_ends_the_others(tiny_models, one_thread, monkeypatch):
    inject(monkeypatch, FAIL_AT_STEP, "1:3")  # the follower raises at its third decode step
    lead = _leader(tiny_models)
    batch = RankBatch(lead, lead.rank.decoder, 2)
    with pytest.raises(TPFailed, match=r"rank 1 of 2 failed: RuntimeError: injected failure at "
                                       r"decode step 3 .*every rank was stopped") as err:
        _decode(lead, 5, batch)
    assert lead._procs[1].returncode == 1
    log = lead._logs[1]  # its traceback, named in the error
    assert str(log) in str(err.value) and "Traceback" in log.read_text()
    log.unlink()
    with pytest.raises(TPFailed) as again:  # later passes say the same, at once
        _decode(lead, 1, batch)
    assert again.value is err.value
    lead.close()


def test_rank0_failing_ends_the_followers(tiny_models, one_thread):
    lead = _leader(tiny_models)
    batch = RankBatch(lead, lead.rank.decoder, 2)

    def broken(n, kv_len, lens):
        raise ValueError("rank 0 broke")

    batch.launch = broken  # the follower is left waiting inside the step's first all-reduce
    with pytest.raises(TPFailed, match="rank 0 of 2 failed: ValueError: rank 0 broke"):
        _decode(lead, 2, batch)
    assert lead._procs[1].poll() is not None  # ended, not left waiting on a collective


def test_a_killed_rank_is_reported(tiny_models, one_thread):
    lead = _leader(tiny_models)
    _decode(lead, 2)
    os.kill(lead._procs[1].pid, signal.SIGKILL)
    lead._procs[1].wait()
    with pytest.raises(TPFailed, match="rank 1 of 2 failed: the process was killed by signal 9"):
        _decode(lead, 2)
