"""Qwen3-MoE and Mixtral on the engine's own step (models/moe_step.py) against transformers, fp32
on the CPU: tiny folders of two layers, 8 experts, top-2 (tests/fixtures/experts.py). Greedy
tokens equal transformers' token for token (Qwen3-MoE with and without norm_topk_prob); the rows
of one batched step, routed to different experts, give what each gives alone; bf16 logits as
close to fp32 as transformers' own bf16 modules are; the planner reads
a checkpoint's expert tensors as its config says; `hearth bench`'s roofline counts the bytes of
the experts a token reads."""

from __future__ import annotations

import json

import pytest
import torch

from engine.cli import cli
from engine.events import LoadRequest
from engine.formats.model_shape import ModelShape
from engine.generate.session import Session
from engine.models import experts
from engine.models.moe_step import MoeStep
from tests.engine.generate.test_batch_run import concurrent_equals_alone, teacher_forced_rows
from tests.engine.helpers import PROMPT, greedy_request, hf_greedy, token_ids
from tests.engine.models.test_gemma import _teacher_forced
from tests.fixtures import experts as fixture

N_NEW = 30
KINDS = ("qwen3_moe", "qwen3_moe_unnormed", "mixtral")


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer_dir):
    root = tmp_path_factory.mktemp("experts")
    return {kind: fixture.build(root / kind, tokenizer_dir, kind) for kind in KINDS}


@pytest.fixture(scope="module")
def sessions(folders, one_thread):
    return {kind: Session.load(LoadRequest(str(folders[kind]), device="cpu")) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_equals_transformers(kind, folders, sessions):
    s = sessions[kind]
    assert isinstance(s.decoder.family, MoeStep) and s.decoder.mode == "static"
    layer = s.decoder.family.layers[0].gate_up
    assert isinstance(layer, experts.ExpertMLP) and layer.top_k == fixture.TOP_K
    assert layer.normalize == (kind != "qwen3_moe_unnormed")
    reference = hf_greedy(folders[kind], PROMPT, N_NEW)
    assert len(set(reference)) >= 8  # the random model wanders: a wrong expert would show
    assert token_ids(list(s.generate(greedy_request(PROMPT, n=N_NEW)))) == reference


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_batched_rows_routed_to_different_experts_equal_each_alone(kind, sessions, monkeypatch):
    assert_batched_rows_routed_apart_equal_each_alone(sessions[kind], monkeypatch, steps=4)


def assert_batched_rows_routed_apart_equal_each_alone(s, monkeypatch, steps: int) -> None:
    """Five rows teacher-forced through batched steps equal each alone, and each batched step's
    first layer sent its rows to different experts."""
    routed = []  # each batched step's first layer: the experts of each of its rows
    call = experts.ExpertMLP.__call__

    def recording(self, h):
        if self is s.decoder.family.layers[0].gate_up and h.shape[1] == 5:
            ids, _ = self.route(h.reshape(-1, h.shape[-1]))
            routed.append([frozenset(row) for row in ids.tolist()])
        return call(self, h)

    monkeypatch.setattr(experts.ExpertMLP, "__call__", recording)
    single, batched = teacher_forced_rows(s, n_seqs=5, steps=steps)
    assert ((batched - single).norm(dim=-1) / single.norm(dim=-1)).max() < 1e-5
    assert routed and all(len(set(rows)) > 1 for rows in routed)  # rows took different experts


def test_concurrent_requests_give_what_each_gives_alone(sessions):
    s = sessions["qwen3_moe"]
    assert s.decoder.family is not None  # the experts' rows in the family step
    run = concurrent_equals_alone(s)
    assert max(run.engine.batch.rows_seen) >= 5


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_bf16_logits_are_as_close_to_fp32_as_transformers_bf16(kind, tmp_path, tokenizer_dir,
                                                               one_thread):
    """The bf16 step against the same weights in fp32, teacher-forced: no farther than
    transformers' own modules in bf16 are (bf16's rounding, routing flips included, is the
    yardstick)."""
    path = str(fixture.build(tmp_path / kind, tokenizer_dir, kind, dtype="bfloat16"))
    ids = torch.randint(3, 2048, (64,), generator=torch.Generator().manual_seed(5))
    runs = [_teacher_forced(Session.load(LoadRequest(path, device="cpu", context=512, **kw)),
                            ids, 32) for kw in ({}, {"eager": True}, {"quant": "fp32"})]
    fast, modules, exact = runs
    rel = lambda a: (a - exact).norm(dim=-1) / exact.norm(dim=-1)  # noqa: E731
    assert rel(modules).median() > 0  # bf16 really rounds: the yardstick is not zero
    assert rel(fast).median() <= 1.5 * rel(modules).median(), (rel(fast), rel(modules))


def test_a_dense_layer_between_sparse_ones_runs_through_transformers_modules():
    from transformers import AutoModelForCausalLM

    from engine.models.step_weights import supports

    config = fixture.config("qwen3_moe", 2048, [2, 0], 0, "float32")
    assert supports(AutoModelForCausalLM.from_config(config))
    config.mlp_only_layers = [1]  # Qwen3-MoE's dense layers: an MLP the experts' step lacks
    assert not supports(AutoModelForCausalLM.from_config(config))


def test_a_checkpoints_expert_tensors_count_as_its_config_says(folders):
    folder = folders["mixtral"]  # one linear a projection an expert on disk
    config = ModelShape.from_config(json.loads((folder / "config.json").read_text()))
    refined = ModelShape.from_folder(folder)
    assert refined.param_source == "safetensors"
    assert refined.num_experts == fixture.EXPERTS and refined.experts_per_token == fixture.TOP_K
    assert sorted(refined.expert_linears) == sorted(config.expert_linears)
    assert refined.total_params == config.total_params  # the routers counted once, as others


def test_bench_reports_decode_against_the_active_bytes_roofline(folders, sessions, capsys):
    assert cli.main(["bench", "--model", str(folders["qwen3_moe"]), "--prompt-len", "16",
                     "--new-tokens", "4", "--num-prompts", "1", "--device", "cpu",
                     "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["active_experts"] == [fixture.TOP_K, fixture.EXPERTS]
    model = sessions["qwen3_moe"].lm.model
    embed = model.get_input_embeddings().weight
    size = {name: p.numel() * p.element_size() for name, p in model.named_parameters()
            if p is not embed}
    routed = sum(b for name, b in size.items() if ".experts." in name)
    assert routed > sum(size.values()) / 3  # the experts are a good part of the weights
    weights = sum(size.values()) - routed + routed * fixture.TOP_K // fixture.EXPERTS
    kv = sessions["qwen3_moe"].cache.bytes_per_token * (16 + 4)
    assert r["bytes_per_decode_step"] == weights + kv
    assert r["roofline_tokens_per_s"] > 0 and r["decode_tokens_per_s"] > 0


def test_a_grouped_kernel_that_fails_at_load_leaves_the_reference(sessions):
    """On a GPU the layers take the Triton product, checked once at load: here (CPU tensors
    outside Triton's interpreter) its launch fails, and every layer keeps the reference."""
    layers = [p.gate_up for p in sessions["mixtral"].decoder.family.layers]
    assert {layer.kernel for layer in layers} == {"reference"}  # CPU: the reference
    assert experts.check_kernel(layers) is None  # nothing to check
    for layer in layers:
        layer.kernel = "triton"
    note = experts.check_kernel(layers)
    assert note.startswith("the grouped expert kernel is off: it failed here")
    assert {layer.kernel for layer in layers} == {"reference"}
