"""One line about a model folder for the picker's list: size on disk, parameters, architecture
and the weight formats present, e.g. "988 MB on disk · 494M parameters · qwen2 · bf16"."""

from __future__ import annotations

from pathlib import Path

from app.models import fit_check
from engine.files.model_catalog import count_text, formats_present, size_on_disk, size_text


def facts_line(folder: Path, shape) -> str:
    """`shape` is the folder's ModelShape, or None where the planner could not read it."""
    parts = [f"{size_text(size_on_disk(folder))} on disk"]
    if shape is not None:
        summary = fit_check.summarize(shape)
        parts.append(f"{count_text(summary.num_params)} parameters")
        parts.append(summary.architecture)
    parts.extend(formats_present(folder, shape))
    return " · ".join(parts)
