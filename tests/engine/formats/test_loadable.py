"""A model the loader refuses is never shown as fitting: the loader's check, the planner,
`hearth plan`, `hearth list`, the Hub listing and the app's picker read one rule
(formats/loadable.py). Every registered family is held to it, those the planner only sizes
(GPT-NeoX, GPT-2, ...) beside those that load, and an architecture no family knows."""

from __future__ import annotations

import json

import pytest

from app.models import fit_check
from engine.cli import cli
from engine.files import model_folder
from engine.files.hub_listing import RepoListing
from engine.formats import families, loadable
from engine.plan import memory as planner
from engine.platform import gpu as engine_gpu
from engine.platform.gpu import GpuInfo, GpuReport

BIG_CARD = 80 * planner.GiB  # far more than these small shapes need


def config(model_type: str, architectures: tuple[str, ...]) -> dict:
    cfg = {"model_type": model_type, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
           "vocab_size": 256, "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
           # what a mixture of experts' config adds (a dense family reads none of it)
           "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 64}
    return cfg | ({"architectures": list(architectures[:1])} if architectures else {})


CASES = [pytest.param(config(f.model_type, f.architectures), f.loads, id=f.model_type)
         for f in families.registered()]
CASES.append(pytest.param(config("mamba", ("MambaForCausalLM",)), False, id="unknown"))


@pytest.mark.parametrize(("cfg", "loads"), CASES)
def test_it_fits_only_where_it_loads(tmp_path, cfg, loads):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    reason = loadable.refusal(cfg)
    assert (reason is None) is loads
    shape = planner.ModelShape.from_config(cfg)
    rec = planner.recommend(shape, BIG_CARD, (9, 0))
    plan = planner.plan(shape, "auto", "auto", None, BIG_CARD, compute_capability=(9, 0))
    assert rec.fits is loads and plan.fits is loads
    assert planner.recommend(shape, None).fits is (None if loads else False)  # no card given
    assert RepoListing("org/name", "ab" * 20, (), 0, cfg).is_supported is loads
    if loads:
        assert model_folder.config_only_folder(str(tmp_path)).config == cfg
        assert fit_check.shape_from_config(cfg).refusal is None
        return
    assert reason in rec.note and reason in " ".join(plan.notes)
    with pytest.raises(model_folder.BadModel) as refused:
        model_folder.config_only_folder(str(tmp_path))
    assert str(refused.value) == reason  # the loader's own sentence
    with pytest.raises(planner.PlanError, match="does not load"):
        fit_check.shape_from_config(cfg)
    with pytest.raises(planner.PlanError, match="does not load"):
        fit_check.model_shape(tmp_path)


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """A model the planner sizes but the loader refuses, and one it loads, both in the Hub
    cache as `hearth list` finds them; a card that holds either many times over."""
    free = 80 * planner.GiB
    monkeypatch.setattr(engine_gpu, "detect_gpus", lambda: GpuReport((GpuInfo(
        0, "Test Card", "GPU-test", free, free, 0, (9, 0), "999", True, True),)))
    monkeypatch.setenv("HEARTH_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    made = {}
    for name, cfg in (("neox", config("gpt_neox", ("GPTNeoXForCausalLM",))),
                      ("llama", config("llama", ("LlamaForCausalLM",)))):
        repo = tmp_path / "hub" / f"models--test--{name}"
        snapshot = repo / "snapshots" / ("ab" * 20)
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(json.dumps(cfg))
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("ab" * 20)
        made[name] = snapshot
    return made


def test_hearth_plan_refuses_what_does_not_load_on_any_card(folders, capsys):
    assert cli.main(["plan", "--model", str(folders["llama"]), "--vram", "80"]) == 0
    capsys.readouterr()
    assert cli.main(["plan", "--model", str(folders["neox"]), "--vram", "80"]) == 2
    out, err = capsys.readouterr()
    assert "DOES NOT FIT" in out and " fits" not in out  # the bytes shown, never a fit
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "GPTNeoXForCausalLM is not supported" in err and "does not load" in err


def test_hearth_list_says_which_does_not_load(folders, capsys):
    assert cli.main(["list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["models"]}
    assert rows["test/llama"]["fits"] is True and rows["test/llama"]["fit"].startswith("fits")
    assert rows["test/neox"]["fits"] is False
    assert rows["test/neox"]["fit"].startswith("does not load: architecture "
                                               "GPTNeoXForCausalLM is not supported")
