"""The models on this machine that load by name: the bundled demo model, Hearth's models folder
(imports, the starter model) and the local Hugging Face cache, with their size on disk and
weight format. The window's picker and `hearth list` read the same list. Only lists folders;
checking them is model_folder's job, their fit the planner's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.files import model_home
from engine.files.model_folder import DEMO_MODEL_DIR


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


def imported_entries() -> list[ModelEntry]:
    """Hearth's own models folder: finished GGUF imports and the starter model."""
    try:
        folders = model_home.imported_models()
    except OSError:  # an unreadable models folder lists nothing rather than breaking the picker
        return []
    return [ModelEntry(folder.name, folder, "imported", str(folder)) for folder in folders]


def hub_entries(hub: Path | None = None) -> list[ModelEntry]:
    """models--ORG--NAME/snapshots/<rev> folders holding a config.json, newest revision first."""
    hub = hub or model_home.hub_cache_dir()
    entries = []
    for repo in sorted(hub.glob("models--*")):
        snapshot = model_home.hub_snapshot(repo)
        if snapshot is not None and (snapshot / "config.json").is_file():
            repo_id = repo.name.removeprefix("models--").replace("--", "/")
            entries.append(ModelEntry(repo_id, snapshot, "hub", repo_id))
    return entries


def local_entries(hub: Path | None = None) -> list[ModelEntry]:
    """Every model that loads by name: the demo model, the models folder, the Hub cache."""
    demo = demo_entry()
    return ([demo] if demo else []) + imported_entries() + hub_entries(hub)


def size_on_disk(folder: Path) -> int:
    """The files of the folder itself (a Hub snapshot's links count as the blobs they point
    to); 0 where it cannot be read."""
    total = 0
    try:
        for p in folder.iterdir():
            try:
                if p.is_file():
                    total += p.stat().st_size
            except OSError:
                continue
    except OSError:
        return 0
    return total


def formats_present(folder: Path, shape) -> list[str]:
    """The checkpoint's format (awq, nf4, int8) or its dtype, and GGUF files beside it; `shape`
    is the folder's ModelShape, or None where the planner could not read it."""
    formats = [shape.quant_method or shape.native_dtype] if shape is not None else []
    try:
        if any(p.suffix == ".gguf" for p in folder.iterdir()):
            formats.append("gguf")
    except OSError:
        pass
    return formats


def size_text(num_bytes: float) -> str:
    """Decimal units, as the Hub's pages write them: 824 kB, 15.2 MB, 1.54 GB."""
    for unit, scale, digits in (("GB", 1e9, 2), ("MB", 1e6, 1), ("kB", 1e3, 0)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.{digits}f} {unit}"
    return f"{num_bytes:.0f} B"


def count_text(n: int) -> str:
    """A count as the Hub writes it: 1.2M, 7.6B, 950."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}".replace(".0", "")
    return str(n)
