"""The model that loads when none is asked for is decided once (engine/files/model_home.py) and
the window, its picker and the `hearth` command all ask it: after `hearth import --starter`
they all open the starter model."""

from __future__ import annotations

import json
import shutil

from app import __main__ as app_main
from app.models.model_picker_dialog import ModelPickerDialog
from engine.cli import cli
from engine.files import model_home
from engine.files.model_home import STARTER_NAME, models_dir, starter_dir


def cli_default(capsys) -> str:
    """The model `hearth` loads without --model (`hearth plan` reads config.json only)."""
    assert cli.main(["plan", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["model"]


def window_default(qtbot, settings) -> tuple[str | None, str]:
    """(what the window loads at its start, what its picker preselects on a first run)."""
    dialog = ModelPickerDialog(settings)
    qtbot.addWidget(dialog)
    return (app_main.load_request(app_main.parse_args([])).model,
            str(dialog.selected_entry().folder))


def test_the_starter_model_is_the_default_of_the_cli_and_the_window(qtbot, settings,
                                                                     tiny_model, capsys):
    shutil.copytree(tiny_model, starter_dir())  # what `hearth import --starter` leaves
    assert model_home.default_model() == str(starter_dir())
    assert window_default(qtbot, settings) == (str(starter_dir()), str(starter_dir()))
    assert cli_default(capsys) == str(starter_dir())


def test_the_cli_and_the_window_ask_the_same_function(qtbot, settings, tiny_models, capsys,
                                                      monkeypatch):
    shutil.copytree(tiny_models["qwen2"], starter_dir())
    other = models_dir() / "Other-Model"
    shutil.copytree(tiny_models["llama"], other)
    monkeypatch.setattr(model_home, "default_model", lambda: str(other))  # a changed decision
    assert window_default(qtbot, settings) == (str(other), str(other))
    assert cli_default(capsys) == str(other)


def test_the_window_and_the_cli_take_a_name_from_the_models_folder(tiny_model, capsys):
    shutil.copytree(tiny_model, starter_dir())
    assert cli.main(["plan", "--model", STARTER_NAME, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == str(starter_dir())
    assert app_main.load_request(app_main.parse_args(["--model", STARTER_NAME])).model == (
        STARTER_NAME)  # the worker resolves it as the CLI does (model_folder.resolve)
