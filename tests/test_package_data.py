"""What the wheel carries: every file in hearth_resources/ is package data in pyproject.toml, no
screenshot is, the code finds them through importlib.resources, and `hearth gui --model`. CI
builds the wheel and runs it alone in a fresh venv (.ci/run); this is the fast half."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from engine.cli import cli
from engine.files import model_folder
from engine.tools import desktop_entry
from hearth_resources import folder
from tests.engine.helpers import REPO

PACKAGE = REPO / "hearth_resources"


def packaged_files() -> set[Path]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    # one entry a package: hearth_resources and each of its folders (hearth_resources.icons)
    entries = config["tool"]["setuptools"]["package-data"].items()
    return {p for package, patterns in entries if package.split(".")[0] == "hearth_resources"
            for pattern in patterns
            for p in (REPO.joinpath(*package.split("."))).glob(pattern) if p.is_file()}


def test_every_resource_is_package_data():
    files = {p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts
             and p.suffix != ".py"}
    assert files and files == packaged_files()
    names = {p.relative_to(PACKAGE).as_posix() for p in files}
    assert {"hearth.qss", "hearth.desktop", "icons/hearth.svg", "demo_model/model.safetensors",
            "demo_draft/model.safetensors"} <= names
    assert not any(p.suffix == ".png" for p in files)  # screenshots stay in docs/


def test_the_code_finds_resources_through_the_package():
    assert folder() == PACKAGE
    assert model_folder.DEMO_MODEL_DIR == PACKAGE / "demo_model"
    assert desktop_entry.TEMPLATE.is_file() and desktop_entry.ICON.is_file()
    # and from a folder that is not the clone, as an installed wheel runs
    code = "import hearth_resources as r, app.paths as p; print(r.folder(), p.DEMO_MODEL_DIR)"
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [str(PACKAGE), str(PACKAGE / "demo_model")]


def test_gui_takes_a_model(tiny_models, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(cli.subprocess, "call", lambda argv, env: calls.append(argv) or 0)
    assert cli.main(["gui", "--model", str(tiny_models["qwen2"])]) == 0
    assert calls == [[sys.executable, "-m", "app", "--model", str(tiny_models["qwen2"])]]
    assert cli.main(["gui"]) == 0 and calls[-1] == [sys.executable, "-m", "app"]
    assert cli.main(["gui", "--model", "/no/such/folder"]) == 2  # checked here, one sentence
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(calls) == 2
