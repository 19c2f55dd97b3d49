"""`--model NAME` from Hearth's models folder, `hearth list` and `hearth pull`, in-process through
the `hearth` entry point, on tiny fixture models in a models folder and a Hub cache of the test's
own, and a fake Hub on localhost (tests/app/fake_hub.py): never the real one."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.cli import cli
from engine.files import model_folder
from engine.files.model_catalog import size_on_disk
from engine.files.model_home import STARTER_NAME
from engine.plan import memory as planner
from engine.platform import gpu as engine_gpu
from engine.platform.gpu import GpuInfo, GpuReport
from tests.app.fake_hub import folder_files, serving

REPO = "hearth-test/tiny-qwen2"
COMMIT = "ab" * 20


@pytest.fixture
def models(tmp_path, monkeypatch):
    """Hearth's models folder and the Hub cache, both empty, and no GPU unless a test says."""
    monkeypatch.setenv("HEARTH_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(engine_gpu, "detect_gpus", lambda: GpuReport((), "no GPU in this test"))
    (tmp_path / "models").mkdir()
    return tmp_path / "models"


def card(free_gib: float) -> GpuReport:
    free = int(free_gib * planner.GiB)
    return GpuReport((GpuInfo(0, "Test Card", "GPU-test", free, free, 0, (8, 9), "999",
                              True, True),))


def cached(tmp_path, folder, repo_id: str = REPO):
    """`folder` as huggingface_hub lays a download out in the cache."""
    repo = tmp_path / "hub" / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(folder, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return repo / "snapshots" / COMMIT


def test_model_takes_a_name_from_the_models_folder(models, tiny_model, capsys):
    shutil.copytree(tiny_model, models / "Tiny-Chat")
    assert cli.main(["run", "--model", "Tiny-Chat", "--prompt", "hi", "--temperature", "0",
                     "--max-new-tokens", "2", "--json"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    loaded = next(e for e in events if e["event"] == "loaded")
    assert loaded["model"] == str(models / "Tiny-Chat")
    assert events[-1]["event"] == "finished"


@pytest.mark.parametrize("command", [["run", "--prompt", "hi"], ["chat"], ["plan"]])
def test_a_name_not_there_names_the_models_folder_and_how_to_list(models, tiny_model, capsys,
                                                                   command):
    shutil.copytree(tiny_model, models / "Tiny-Chat")
    assert cli.main([*command, "--model", "Tiny-Chta"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(models) in err and "`hearth list`" in err and "Tiny-Chta" in err


def test_a_repo_id_not_cached_says_how_to_pull_it(models, capsys):
    assert cli.main(["run", "--model", REPO, "--prompt", "hi"]) == 2
    assert f"`hearth pull {REPO}`" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["../models/.hidden", ".hidden", "./.hidden", "C:x"])
def test_a_name_never_leads_out_of_the_models_folder(models, tiny_model, name, capsys):
    shutil.copytree(tiny_model, models / ".hidden")  # an import in progress is hidden
    assert cli.main(["plan", "--model", name]) == 2


def test_list_shows_each_model_with_its_size_format_and_fit(models, tiny_models, tmp_path,
                                                            capsys):
    shutil.copytree(tiny_models["qwen2"], models / STARTER_NAME)
    shutil.copytree(tiny_models["llama"], models / "Tiny-Llama")
    cached(tmp_path, tiny_models["qwen2"])
    assert cli.main(["list"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].split() == ["NAME", "SOURCE", "SIZE", "PARAMS", "FORMAT", "FIT"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) >= {STARTER_NAME, "Tiny-Llama", REPO}
    assert f"{STARTER_NAME} *" in rows[STARTER_NAME]  # the default: no --model loads it
    assert "*" not in rows["Tiny-Llama"] and "demo" in "".join(lines)
    for name in (STARTER_NAME, "Tiny-Llama", REPO):
        assert " fp32 " in rows[name] and "CPU: fp32, 2,048 tokens" in rows[name]
    assert str(models) in captured.err


def test_list_json_agrees_with_the_folders_and_the_planner(models, tiny_models, tmp_path,
                                                           capsys, monkeypatch):
    shutil.copytree(tiny_models["qwen2"], models / "Tiny-Chat")
    snapshot = cached(tmp_path, tiny_models["qwen2"])
    monkeypatch.setattr(engine_gpu, "detect_gpus", lambda: card(0.5))
    assert cli.main(["list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["models_dir"] == str(models) and listing["gpu"] == "Test Card"
    by_name = {m["name"]: m for m in listing["models"]}
    assert by_name["Tiny-Chat"]["source"] == "imported"
    assert by_name[REPO]["folder"] == str(snapshot)
    shape = planner.ModelShape.from_folder(snapshot)
    rec = planner.recommend(shape, int(0.5 * planner.GiB), (8, 9))
    for name in ("Tiny-Chat", REPO):
        m = by_name[name]
        assert m["size_bytes"] == size_on_disk(snapshot) > 0
        assert (m["format"], m["num_params"]) == ("fp32", shape.total_params)
        assert (m["fits"], m["quant"], m["context"]) == (rec.fits, rec.quant, rec.context)
    demo = [m for m in listing["models"] if m["source"] == "demo"]
    assert [m["default"] for m in demo] == [True]  # no starter: the bundled demo model
    assert not any(m["default"] for m in listing["models"] if m["source"] != "demo")


def test_list_says_when_a_model_does_not_fit(models, tiny_models, capsys, monkeypatch):
    shutil.copytree(tiny_models["qwen2"], models / "Tiny-Chat")
    monkeypatch.setattr(engine_gpu, "detect_gpus", lambda: card(0.01))
    assert cli.main(["list", "--json"]) == 0
    [m] = [m for m in json.loads(capsys.readouterr().out)["models"] if m["name"] == "Tiny-Chat"]
    assert m["fits"] is False and m["fit"].startswith("does not fit")


@pytest.fixture
def hub(tiny_model, monkeypatch):
    repos = {REPO: {**folder_files(tiny_model), "pytorch_model.bin": b"\x80" * 100},
             "hearth-test/pickles": {"config.json": b"{}", "pytorch_model.bin": b"\x80" * 10},
             "hearth-test/bert": {"config.json": json.dumps({"architectures": ["BertModel"]})
                                  .encode(), "model.safetensors": b"\0" * 64}}
    with serving(repos, monkeypatch) as fake:
        yield fake


def test_pull_downloads_as_the_window_does_and_the_model_then_loads_by_its_id(
        models, hub, tiny_model, tmp_path, capsys):
    assert cli.main(["pull", REPO]) == 0
    err = capsys.readouterr().err
    snapshot = tmp_path / "hub" / "models--hearth-test--tiny-qwen2" / "snapshots" / hub.commit(
        REPO)
    assert f"downloaded {REPO} into {snapshot}" in err
    assert "[1/" in err and "model.safetensors" in err and "(100%)" in err  # progress lines
    assert {p.name for p in snapshot.iterdir()} == {p.name for p in tiny_model.iterdir()}
    assert (snapshot / "model.safetensors").read_bytes() == (
        tiny_model / "model.safetensors").read_bytes()
    assert model_folder.check(REPO).path == snapshot  # `--model REPO` finds it
    assert cli.main(["list", "--json"]) == 0
    assert REPO in [m["name"] for m in json.loads(capsys.readouterr().out)["models"]]
    before = len(hub.requests)
    assert cli.main(["pull", REPO]) == 0  # all there: only the listing is asked for again
    assert [path for _, path, _ in hub.requests[before:]] == [
        f"/api/models/{REPO}", f"/{REPO}/resolve/{hub.commit(REPO)}/config.json"]


@pytest.mark.parametrize(("repo", "words"), [
    ("not a repo", "is not a Hugging Face repo id"),
    ("hearth-test/missing", "there is no model hearth-test/missing"),
    ("hearth-test/pickles", "has no safetensors weights"),
    ("hearth-test/bert", "BertModel is not an architecture Hearth runs"),
])
def test_pull_of_a_repo_that_cannot_be_had_is_one_line_and_exit_2(models, hub, tmp_path, capsys,
                                                                  repo, words):
    assert cli.main(["pull", repo]) == 2
    err = capsys.readouterr().err
    assert words in err and err.strip().splitlines()[-1].startswith("hearth: ")
    assert "Traceback" not in err
    assert not any((tmp_path / "hub").glob("models--*/snapshots/*/*"))  # nothing downloaded
