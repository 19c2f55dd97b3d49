"""Hearth's package data: the bundled demo models, the icon, the style sheet and the desktop-entry
template. Code finds them through importlib.resources (`folder()`), so an installed wheel has
them as a clone does; nothing here imports anything heavy."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def folder() -> Path:
    """This package's folder on disk. A wheel installs as plain files (never zipped: the worker
    opens the demo model's safetensors by path), so the Traversable is a real path."""
    return Path(str(files(__name__)))
