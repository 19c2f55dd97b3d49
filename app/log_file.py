"""The log file users attach to a bug report: the app's and the worker's (stderr) messages."""

from __future__ import annotations

import logging
from logging.handlers import RotatingFileHandler
from pathlib import Path

FILE_NAME = "hearth.log"


def setup_logging(folder: Path) -> Path:
    """Log to folder/hearth.log (rotated at 1 MB, 3 kept) and warnings to stderr too."""
    path = folder / FILE_NAME
    file_handler = RotatingFileHandler(path, maxBytes=1 << 20, backupCount=3, encoding="utf-8")
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    console = logging.StreamHandler()
    console.setLevel(logging.WARNING)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    root.addHandler(file_handler)
    root.addHandler(console)
    return path
