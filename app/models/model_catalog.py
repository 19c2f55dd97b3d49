"""The models a user can pick: every model that loads by name (engine/files/model_catalog: the
bundled demo model, Hearth's imported models, the local Hugging Face cache) and folders the user
added. Only lists folders; reading and checking them is fit_check's job."""

from __future__ import annotations

from pathlib import Path

from app.paths import DEMO_DRAFT_DIR
from engine.files.model_catalog import ModelEntry, hub_entries, imported_entries, local_entries

__all__ = ["ModelEntry", "all_entries", "demo_draft_entry", "folder_entry", "hub_entries",
           "imported_entries"]


def demo_draft_entry() -> ModelEntry | None:
    if (DEMO_DRAFT_DIR / "config.json").is_file():
        return ModelEntry("demo_draft (bundled)", DEMO_DRAFT_DIR, "demo draft",
                          str(DEMO_DRAFT_DIR))
    return None


def folder_entry(folder: Path) -> ModelEntry:
    return ModelEntry(folder.name or str(folder), folder, "folder", str(folder))


def all_entries(folders: list[Path], hub: Path | None = None) -> list[ModelEntry]:
    return local_entries(hub) + [folder_entry(f) for f in folders]
