"""The models a user can pick: the bundled demo model, the local Hugging Face cache, and
folders the user added. Only lists folders; reading and checking them is fit_check's job."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.paths import DEMO_DRAFT_DIR, DEMO_MODEL_DIR, hub_cache_dir


@dataclass(frozen=True)
class ModelEntry:
    label: str
    folder: Path  # where config.json is
    source: str  # "demo", "hub", "folder", or "demo draft" (a draft only, never a target)
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
    return ([demo] if demo else []) + hub_entries(hub) + [folder_entry(f) for f in folders]


def _snapshot(repo: Path) -> Path | None:
    ref = repo / "refs" / "main"
    if ref.is_file():
        snapshot = repo / "snapshots" / ref.read_text().strip()
        if snapshot.is_dir():
            return snapshot
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    found = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None
