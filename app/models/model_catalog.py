"""The models a user can pick: the bundled demo model, Hearth's imported models (the starter
among them), the local Hugging Face cache, and folders the user added. Only lists folders;
reading and checking them is fit_check's job."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.get_model.hub_listing import is_commit_id
from app.paths import DEMO_DRAFT_DIR, DEMO_MODEL_DIR, hub_cache_dir
from engine.files import model_home


@dataclass(frozen=True)
class ModelEntry:
    label: str
    folder: Path  # where config.json is
    source: str  # "demo", "imported", "hub", "folder", or "demo draft" (a draft only)
    load_name: str | None  # what LoadRequest.model gets; None is the demo model


def demo_entry() -> ModelEntry | None:
    if (DEMO_MODEL_DIR / "config.json").is_file():
        return ModelEntry("Demo model (bundled)", DEMO_MODEL_DIR, "demo", None)
    return None


def demo_draft_entry() -> ModelEntry | None:
    if (DEMO_DRAFT_DIR / "config.json").is_file():
        return ModelEntry("demo_draft (bundled)", DEMO_DRAFT_DIR, "demo draft",
                          str(DEMO_DRAFT_DIR))
    return None


def default_load_name() -> str | None:
    """What the window loads when no model is asked for: the starter model once it has been
    imported (a real chat), else None, the bundled demo model (the offline fallback)."""
    return str(model_home.starter_dir()) if model_home.has_starter() else None


def imported_entries() -> list[ModelEntry]:
    """Hearth's own models folder: finished GGUF imports and the starter model."""
    try:
        folders = model_home.imported_models()
    except OSError:  # an unreadable models folder lists nothing rather than breaking the picker
        return []
    return [ModelEntry(folder.name, folder, "imported", str(folder)) for folder in folders]


def hub_entries(hub: Path | None = None) -> list[ModelEntry]:
    """models--ORG--NAME/snapshots/<rev> folders holding a config.json, newest revision first."""
    hub = hub or hub_cache_dir()
    entries = []
    for repo in sorted(hub.glob("models--*")):
        snapshot = _snapshot(repo)
        if snapshot is not None and (snapshot / "config.json").is_file():
            repo_id = repo.name.removeprefix("models--").replace("--", "/")
            entries.append(ModelEntry(repo_id, snapshot, "hub", repo_id))
    return entries


def folder_entry(folder: Path) -> ModelEntry:
    return ModelEntry(folder.name or str(folder), folder, "folder", str(folder))


def all_entries(folders: list[Path], hub: Path | None = None) -> list[ModelEntry]:
    demo = demo_entry()
    return (([demo] if demo else []) + imported_entries() + hub_entries(hub)
            + [folder_entry(f) for f in folders])


def _snapshot(repo: Path) -> Path | None:
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
