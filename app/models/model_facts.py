"""One line about a model folder for the picker's list: size on disk, parameters, architecture
and the weight formats present, e.g. "988 MB on disk · 494M parameters · qwen2 · bf16"."""

from __future__ import annotations

from pathlib import Path

from app.get_model.get_model_panel import size_text
from app.get_model.hub_search import downloads_text
from app.models import fit_check


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
    """The checkpoint's format (awq, nf4, int8) or its dtype, and GGUF files beside it."""
    formats = [shape.quant_method or shape.native_dtype] if shape is not None else []
    try:
        if any(p.suffix == ".gguf" for p in folder.iterdir()):
            formats.append("gguf")
    except OSError:
        pass
    return formats


def facts_line(folder: Path, shape) -> str:
    """`shape` is the folder's ModelShape, or None where the planner could not read it."""
    parts = [f"{size_text(size_on_disk(folder))} on disk"]
    if shape is not None:
        summary = fit_check.summarize(shape)
        parts.append(f"{downloads_text(summary.num_params)} parameters")
        parts.append(summary.architecture)
    parts.extend(formats_present(folder, shape))
    return " · ".join(parts)
