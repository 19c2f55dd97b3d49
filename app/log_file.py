"""The log file users attach to a bug report: the app's and the worker's (stderr) messages."""

from __future__ import annotations

import logging
from logging.handlers import RotatingFileHandler
from pathlib import Path

FILE_NAME = "hearth.log"


def setup_logging(folder: Path) -> Path | None:
    """Log to folder/hearth.log (rotated at 1 MB, 3 kept) and warnings to stderr too.

    None when the file cannot be written (the folder is read-only or missing): stderr only.
    """
    path = folder / FILE_NAME
    console = logging.StreamHandler()
    console.setLevel(logging.WARNING)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    root.addHandler(console)
    try:
        file_handler = RotatingFileHandler(path, maxBytes=1 << 20, backupCount=3,
                                           encoding="utf-8")
    except OSError:
        return None
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(file_handler)
    return path
