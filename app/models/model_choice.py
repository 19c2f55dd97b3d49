"""Which model to preselect on a first run with a GPU: the largest model in the list that the
planner says fits this card at a chat-sized context (the most capable one that will run). The
bundled demo model (or the starter model, once imported) is the choice only when nothing else
fits, or there is no GPU."""

from __future__ import annotations

from app.models.fit_check import first_gpu, model_shape
from app.models.model_catalog import ModelEntry
from engine.plan import memory as planner
from engine.platform.gpu import GpuReport

CHAT_CONTEXT = 8192  # a model that fits only a shorter context is no first choice


def recommended_entry(entries: list[ModelEntry], report: GpuReport | None) -> ModelEntry | None:
    """The entry to preselect, or None to keep the default (the demo model)."""
    gpu = first_gpu(report)
    if gpu is None:
        return None
    best, best_params = None, -1
    for entry in entries:
        if entry.source not in ("imported", "hub", "folder"):
            continue
        try:
            shape = model_shape(entry.folder)
            rec = planner.recommend(shape, gpu.free_bytes, gpu.compute_capability)
        except (planner.PlanError, ValueError, OSError):
            continue  # unreadable: the picker shows why when it is chosen
        if rec.fits and rec.context >= min(CHAT_CONTEXT, shape.context_limit) and (
                shape.total_params > best_params):
            best, best_params = entry, shape.total_params
    return best
