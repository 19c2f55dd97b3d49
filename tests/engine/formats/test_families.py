"""The family registry (formats/families): every entry agrees with the transformers models the
engine reaches into, and a family registered from a test alone loads, runs the fast path, cuts
for tensor parallelism and plans."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from engine.events import LoadRequest
from engine.files.model_folder import BadModel, check
from engine.formats import families
from engine.formats.model_shape import ModelShape
from engine.generate.session import Session
from engine.parallel import sharded_step
from engine.tools import plan_report, quantize
from tests.engine.helpers import greedy_request, token_ids

TEST_TYPE = "testllama"
TEST_ARCH = "TestLlamaForCausalLM"
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=256, pad_token_id=0, bos_token_id=1,
            eos_token_id=2)  # inside the vocabulary (Phi-3's defaults are not)


class TestLlamaConfig(LlamaConfig):
    """Llama under a name of its own: how transformers learns a model type it never shipped."""

    __test__ = False  # a transformers class, not a pytest one
    model_type = TEST_TYPE


class TestLlamaForCausalLM(LlamaForCausalLM):
    __test__ = False
    config_class = TestLlamaConfig


def _renamed_llama(**changes) -> families.Family:
    """Llama's entry under the test's names: a renamed copy, as the issue asks."""
    return replace(families.get("llama"), model_type=TEST_TYPE, name="TestLlama",
                   architectures=(TEST_ARCH,), gguf_architecture=None, **changes)


@pytest.fixture
def renamed_folder(tiny_models, tmp_path):
    """The tiny Llama folder with only config.json's model_type and architectures renamed."""
    folder = tmp_path / TEST_TYPE
    shutil.copytree(tiny_models["llama"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type=TEST_TYPE, architectures=[TEST_ARCH])
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture
def testllama(renamed_folder):
    """The renamed folder, with its family registered (Llama's entry under the new names) for
    the test only. transformers has no unregister: its entry stays, under a name no model uses."""
    AutoConfig.register(TEST_TYPE, TestLlamaConfig, exist_ok=True)
    AutoModelForCausalLM.register(TestLlamaConfig, TestLlamaForCausalLM, exist_ok=True)
    families.register(_renamed_llama())
    yield renamed_folder
    families.unregister(TEST_TYPE)


def test_an_unregistered_family_is_refused_by_name(renamed_folder):
    with pytest.raises(BadModel, match=f"architecture {TEST_ARCH} is not supported"):
        check(str(renamed_folder))
    assert TEST_TYPE not in families.fast_path_types()


def test_a_family_registered_from_a_test_loads_runs_the_fast_path_and_plans(
        testllama, tiny_models, one_thread, capsys):
    renamed = Session.load(LoadRequest(str(testllama), device="cpu"))
    assert type(renamed.lm.model) is TestLlamaForCausalLM
    assert renamed.decoder.mode == "static" and renamed.decoder.family is not None
    llama = Session.load(LoadRequest(str(tiny_models["llama"]), device="cpu"))
    a = token_ids(list(renamed.generate(greedy_request(n=24))))
    assert len(a) == 24 and a == token_ids(list(llama.generate(greedy_request(n=24))))

    # tensor parallelism cuts it as it cuts Llama: the same tensors, in the same layout
    spec = sharded_step.spec_of(renamed.lm.model, 2, 64, "fp32")
    assert spec == sharded_step.spec_of(llama.lm.model, 2, 64, "fp32")
    cut = [(n, t.shape) for n, t in sharded_step.shard(renamed.lm.model, spec, 1, "cpu")]
    assert cut == [(n, torch.Size(s)) for n, s, _ in sharded_step.layout(spec)]
    quantize.check_model(dict(json.loads((testllama / "config.json").read_text()),
                              hidden_size=128, intermediate_size=256))

    plans = {}
    for name, folder in (("renamed", testllama), ("llama", tiny_models["llama"])):
        assert plan_report.run_plan(str(folder), vram_gib=24, as_json=True) == 0
        one = json.loads(capsys.readouterr().out)
        assert plan_report.run_plan(str(folder), vram_gib=24, as_json=True,
                                    tensor_parallel=2) == 0
        plans[name] = one, json.loads(capsys.readouterr().out)
    (one, two), (ref_one, ref_two) = plans["renamed"], plans["llama"]
    assert one["model_type"] == TEST_TYPE and one["fits"]
    assert {k: v for k, v in one.items() if k not in ("model", "model_type")} == {
        k: v for k, v in ref_one.items() if k not in ("model", "model_type")}
    assert two["model_type"] == TEST_TYPE and two["fits"]
    assert {k: v for k, v in two.items() if k not in ("model", "model_type")} == {
        k: v for k, v in ref_two.items() if k not in ("model", "model_type")}


def test_the_entry_decides_the_path(testllama, one_thread):
    # the same folder with its family taken off the fast path: transformers' modules, same tokens
    fast = Session.load(LoadRequest(str(testllama), device="cpu"))
    families.unregister(TEST_TYPE)
    families.register(_renamed_llama(fast_path=False, tensor_parallel=False))
    slow = Session.load(LoadRequest(str(testllama), device="cpu"))
    assert slow.decoder.mode == "generic"
    assert any("the fused step covers Llama, Mistral, Qwen2, Qwen3, Gemma 3, Gemma 2 and Phi-3" in n
               for n in slow.loaded_event().notes)
    assert token_ids(list(slow.generate(greedy_request(n=16)))) == token_ids(
        list(fast.generate(greedy_request(n=16))))


def test_register_refuses_a_taken_or_contradictory_entry():
    llama = families.get("llama")
    with pytest.raises(ValueError, match="'llama' is taken"):
        families.register(llama)
    with pytest.raises(ValueError, match="LlamaForCausalLM is taken"):
        families.register(replace(llama, model_type="llama_again"))
    with pytest.raises(ValueError, match="runs the fast path's math"):
        families.register(replace(llama, model_type="x", architectures=("X",), fast_path=False))
    with pytest.raises(ValueError, match="module names"):
        families.register(replace(llama, model_type="x", architectures=("X",), names=None))
    assert families.get("llama_again") is None and families.get("x") is None


def _has(module: torch.nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def _tiny(model_type: str):
    config = AutoConfig.for_model(model_type, **TINY)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


@pytest.mark.parametrize("family", [f for f in families.registered() if f.loads],
                         ids=lambda f: f.model_type)
def test_every_family_that_loads_is_what_transformers_builds(family):
    for arch in family.architectures:
        assert getattr(transformers, arch).config_class.model_type == family.model_type
    # the planner's default where config.json is silent is transformers' own
    assert AutoConfig.for_model(family.model_type).tie_word_embeddings == family.tied_by_default
    if family.names is None:
        return
    model, n = _tiny(family.model_type), family.names
    for path in (n.layers, n.embed, n.norm, n.rotary, n.lm_head):
        model.get_submodule(path)
    layer = model.get_submodule(n.layers)[0]
    # "": fused into the one before it (Phi-3's qkv_proj and gate_up_proj)
    assert all(type(layer.get_submodule(p)) is torch.nn.Linear for p in n.linears if p)
    assert (layer.get_submodule(n.q).bias is not None) == family.qkv_bias
    assert [_has(layer, n.q_norm), _has(layer, n.k_norm)] == [family.qk_norm] * 2
    for prev, linears in () if n.fused else n.awq_groups:  # each reads one input: the op before
        widths = {layer.get_submodule(p).in_features for p in linears}
        assert len(widths) == 1
        layer.get_submodule(prev)


@pytest.mark.parametrize("family", [f for f in families.registered() if f.tensor_parallel],
                         ids=lambda f: f.model_type)
def test_every_family_that_splits_has_a_shard_for_each_rank(family):
    model = _tiny(family.model_type)
    spec = sharded_step.spec_of(model, 2, 64, "fp32")
    assert (spec.qkv_bias, spec.qk_norm) == (family.qkv_bias, family.qk_norm)
    want = [(name, torch.Size(shape)) for name, shape, _ in sharded_step.layout(spec)]
    for rank in (0, 1):
        assert [(name, t.shape) for name, t in sharded_step.shard(model, spec, rank, "cpu")] == want


def test_the_planner_reads_the_quirks_from_the_registry():
    cfg = dict(model_type="qwen3", hidden_size=1024, num_hidden_layers=28,
               num_attention_heads=16, num_key_value_heads=8, head_dim=128,
               intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True)
    qwen3 = ModelShape.from_config(cfg)
    llama = ModelShape.from_config(dict(cfg, model_type="llama"))
    assert qwen3.other_params - llama.other_params == 28 * 2 * 128  # the head norms
    # a relative the family claims by prefix is sized with its head norms too
    assert ModelShape.from_config(dict(cfg, model_type="qwen3_moe")).other_params == (
        qwen3.other_params)
    qwen2 = ModelShape.from_config(dict(cfg, model_type="qwen2"))
    assert qwen2.other_params - llama.other_params == 28 * (16 + 2 * 8) * 128  # q/k/v biases
    assert families.planned_as("qwen2_moe") is None  # exact names only, unless claimed
