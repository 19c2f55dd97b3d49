"""Before torch is imported: can this model and this machine take `--tensor-parallel N`? The
model must split N ways (whole KV heads, equal MLP slices) and N GPUs must be visible, unless
`--device cpu` asks for N CPU processes over gloo (tests, and trying the path without GPUs).
The settings a cut supports are LoadRequest.validate's; the load itself is parallel/session.py's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.events import BadRequest, LoadRequest
from engine.formats.model_shape import ModelShape
from engine.plan.multi_gpu import split_error, valid_splits
from engine.platform.gpu import detect_gpus


def visible_gpus() -> tuple[int, str]:
    """(how many GPUs CUDA will see, why not more): NVML's count, narrowed by
    CUDA_VISIBLE_DEVICES, which NVML ignores but CUDA obeys."""
    report = detect_gpus()
    count, why = len(report.gpus), report.reason or ""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        shown = len([d for d in listed.split(",") if d.strip()])
        if shown < count:
            count, why = shown, f"CUDA_VISIBLE_DEVICES={listed!r} shows {shown}"
    return count, why


def check(req: LoadRequest, folder: Path) -> None:
    """BadRequest (one sentence) where `req.tensor_parallel` cannot run; nothing for N = 1."""
    n = req.tensor_parallel
    if n == 1:
        return
    try:
        shape = ModelShape.from_config(json.loads((folder / "config.json").read_text()))
    except (OSError, ValueError):  # PlanError too: the loader says why, in its own words
        shape = None
    err = shape and split_error(shape, n)
    if err:
        ways = ", ".join(str(k) for k in valid_splits(shape) if k > 1)
        raise BadRequest(f"{err}" + (f"; --tensor-parallel takes {ways}" if ways else ""))
    if req.device == "cpu":
        return
    count, why = visible_gpus()
    if count < n:
        why = f" ({why.removesuffix('; CPU mode')})" if why else ""
        raise BadRequest(f"--tensor-parallel {n} needs {n} NVIDIA GPUs and this machine has "
                         f"{count}{why}; --device cpu runs the {n} ranks as CPU processes "
                         f"(gloo), for testing")

