"""Where Hearth keeps things on disk: its data folder, the bundled resources, the Hub cache."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QStandardPaths

from hearth_resources import folder as resources_folder

# the folder that holds the `app` and `engine` packages: a clone, or site-packages
REPO_ROOT = Path(__file__).resolve().parent.parent
# icons, the style sheet, the demo models: package data, found alike in a clone and a wheel
RESOURCES_DIR = resources_folder()
# The folder the worker loads for LoadRequest(model=None)
# (engine.files.model_folder.DEMO_MODEL_DIR).
DEMO_MODEL_DIR = RESOURCES_DIR / "demo_model"
DEMO_DRAFT_DIR = RESOURCES_DIR / "demo_draft"  # the demo model's speculative draft


def data_dir() -> Path:
    """$HEARTH_DATA_DIR, else the platform's per-user application data folder; created if it
    can be (store_opening.py tells the user when it cannot)."""
    env = os.environ.get("HEARTH_DATA_DIR")
    if env:
        path = Path(env)
    else:
        location = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)
        path = Path(location) if location else Path.home() / ".local" / "share" / "hearth"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # a file in its place, a read-only parent: the start goes on, and says so
    return path
