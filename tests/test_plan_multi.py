"""The planner for several cards: the cut's arithmetic (against the real cut of a tiny model),
bytes per card, and the split it recommends when one card is too small."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.plan.memory import GiB, ModelShape, PlanError, kv_bytes_per_token, plan, weight_bytes
from engine.plan.multi_gpu import (
    NCCL_BUFFERS_BYTES,
    plan_multi,
    rank_shape,
    recommend_split,
    split_error,
    valid_splits,
)
from tests.test_plan import QWEN05B, QWEN7B, QWEN72B

REPO = Path(__file__).resolve().parents[1]
QWEN14B = dict(QWEN7B, hidden_size=5120, num_hidden_layers=48, num_attention_heads=40,
               num_key_value_heads=8, intermediate_size=13824)  # ~29.5 GB in bf16
AWQ = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128},
       "torch_dtype": "float16"}
CARD24 = 24 * GiB
shape = ModelShape.from_config


def test_the_planner_needs_no_torch():
    code = "import sys, engine.plan.multi_gpu; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_family_is_the_engines():
    from engine.formats import families

    # the planner splits exactly the families tensor parallelism cuts (parallel/sharded_step.py:
    # the engine's own step; not every family on that step, Gemma 3 not yet)
    types = [f.model_type for f in families.registered()]
    tp = [t for t in types if split_error(shape(dict(QWEN7B, model_type=t)), 2) is None]
    assert tp == list(families.tensor_parallel_types())
    assert set(tp) < set(families.fast_path_types())


def test_one_card_is_the_single_card_plan():
    s = shape(QWEN7B)
    one, ref = plan_multi(s, 1, "bf16", "bf16", 8192, CARD24), plan(s, "bf16", "bf16", 8192, CARD24)
    assert one.allreduce_bytes == 0 and one.total_bytes_per_device == ref.total_bytes
    assert (one.fits, one.max_context, one.weights_bytes_per_device) == (
        ref.fits, ref.max_context, ref.weights_bytes)


def test_a_rank_counts_no_prefill_graph_pool():
    """One GPU's engine replays prefill chunks as CUDA graphs (step/prefill_graphs.py) and the
    planner counts their pool; a tensor-parallel rank replays decode steps only."""
    from engine.plan.memory import workspace_bytes
    from engine.plan.sizes import PREFILL_CHUNK, PREFILL_GRAPH_TOKENS

    s = shape(QWEN7B)
    r = rank_shape(s, 2)
    tp = plan_multi(s, 2, "bf16", "bf16", 8192, CARD24)
    alone = plan(r, "bf16", "bf16", 8192, CARD24)  # the rank's shape, planned as one GPU's
    pool = workspace_bytes(r, "bf16", "bf16", min(PREFILL_CHUNK, PREFILL_GRAPH_TOKENS), 1, 0)
    assert pool > 0 and tp.graph_pool_bytes == alone.graph_pool_bytes - pool


def test_seven_b_cut_two_ways():
    s, r = shape(QWEN7B), rank_shape(shape(QWEN7B), 2)
    layers = sum(o * i * n for o, i, n in s.linears)
    # the layers' linears and the (untied) lm_head halve; the embedding and norms do not
    assert sum(o * i * n for o, i, n in r.linears) * 2 == layers
    assert r.lm_head_params * 2 == s.lm_head_params and r.embed_params == s.embed_params
    assert r.total_params == s.embed_params + s.other_params + (layers + s.lm_head_params) // 2
    assert kv_bytes_per_token(r, "bf16") * 2 == kv_bytes_per_token(s, "bf16")
    p = plan_multi(s, 2, "bf16", "bf16", 32768, CARD24)
    assert p.weights_bytes_per_device == 2 * r.total_params
    assert p.allreduce_bytes == NCCL_BUFFERS_BYTES and p.fits
    assert p.total_bytes == 2 * p.total_bytes_per_device
    assert p.host_bytes == weight_bytes(s, "bf16")  # rank 0 holds it all while it cuts


def test_fourteen_b_is_the_issues_two_card_case():
    s = shape(QWEN14B)
    assert weight_bytes(s, "bf16") > CARD24  # the weights alone exceed one card
    assert not plan_multi(s, 1, "bf16", "bf16", 8192, CARD24).fits
    p = plan_multi(s, 2, "bf16", "bf16", 8192, CARD24)
    assert p.fits and p.total_bytes_per_device < CARD24
    split = recommend_split(s, CARD24, 2, (9, 0), 8192)
    assert (split.num_devices, split.quant, split.kv_dtype, split.fits) == (2, "bf16", "bf16", True)
    assert "tp=2" in split.note and "one card holds nf4" in split.note
    assert split.plan.total_bytes_per_device == p.total_bytes_per_device
    assert split.to_dict()["plan"]["num_devices"] == 2


def test_no_split_when_one_card_holds_the_best():
    split = recommend_split(shape(QWEN7B), 80 * GiB, 2, (9, 0), 8192)
    assert (split.num_devices, split.quant, split.fits, split.note) == (1, "bf16", True, None)


def test_fewest_cards_that_fit():
    # 72B bf16 (~145 GB): two or four 24 GB cards are not enough, eight are
    s = shape(QWEN72B)
    assert recommend_split(s, CARD24, 8, (9, 0), 8192).num_devices == 8
    four = recommend_split(s, CARD24, 4, (9, 0), 8192)
    assert four.fits is False and four.num_devices == 4 and "does not fit 4 cards" in four.note


def test_seed_72b_awq_on_two_24gb_cards():
    s = shape(dict(QWEN72B, **AWQ))
    split = recommend_split(s, CARD24, 2, (8, 9), 4096, tp_formats=("bf16", "awq"))
    assert (split.num_devices, split.quant, split.fits) == (2, "awq", True)
    # the engine cuts 16-bit weights only so far: the default says so rather than promise tp=2
    today = recommend_split(s, CARD24, 2, (8, 9), 4096)
    assert today.num_devices == 1 and not today.fits
    assert "cuts bf16/fp16/fp32 weights only so far" in today.note


def test_splits_that_cannot_be():
    s = shape(QWEN05B)  # 2 KV heads
    assert valid_splits(s) == [1, 2]
    assert "whole KV heads (2)" in split_error(s, 4)
    with pytest.raises(PlanError, match="whole KV heads"):
        plan_multi(s, 4, "bf16", "bf16", 4096)
    gemma = shape(dict(QWEN7B, model_type="gemma"))
    assert valid_splits(gemma) == [1] and "Qwen3" in split_error(gemma, 2)
    split = recommend_split(gemma, 8 * GiB, 2, (9, 0), 4096)
    assert split.num_devices == 1 and "this model is gemma" in split.note


@settings(max_examples=60, deadline=None)
@given(kv=st.sampled_from([1, 2, 4, 8]), group=st.integers(1, 8), layers=st.integers(1, 48),
       n=st.sampled_from([2, 4, 8]), tied=st.booleans(), quant=st.sampled_from(["bf16", "nf4"]))
def test_a_card_holds_its_share_and_the_replicated_rest(kv, group, layers, n, tied, quant):
    cfg = dict(QWEN7B, num_key_value_heads=kv, num_attention_heads=kv * group,
               hidden_size=kv * group * 128, num_hidden_layers=layers, intermediate_size=8 * 1024,
               tie_word_embeddings=tied)
    s = shape(cfg)
    if split_error(s, n):
        assert kv % n
        return
    r = rank_shape(s, n)
    full, one = weight_bytes(s, quant), weight_bytes(r, quant)
    assert full / n <= one <= full  # a share, plus the replicated embedding and norms
    assert kv_bytes_per_token(r, "bf16") * n == kv_bytes_per_token(s, "bf16")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_arithmetic_equals_the_real_cut(arch, tiny_models):
    """The planner's bytes per card against the tensors tensor_parallel.py gives a rank."""
    from engine.events import LoadRequest
    from engine.generate.session import Session
    from engine.parallel.sharded_step import shard, spec_of

    model = Session.load(LoadRequest(str(tiny_models[arch]), device="cpu", eager=True)).lm.model
    spec = spec_of(model, 2, 256, "fp32")
    planned = weight_bytes(rank_shape(ModelShape.from_folder(tiny_models[arch]), 2), "fp32")
    for r in range(2):
        held = sum(t.numel() * t.element_size() for name, t in shard(model, spec, r, "cpu")
                   if name != "inv_freq")  # a buffer, not a weight
        if spec.tied:  # the lm_head rows are a view of the embedding: no bytes of their own
            assert "lm_head" not in dict(shard(model, spec, r, "cpu"))
        # qwen2's q/k/v biases are cut too, but counted whole: the planner errs high by half
        bias = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim * 4 * spec.num_layers // 2
        assert held == planned - (bias if spec.qkv_bias else 0)
