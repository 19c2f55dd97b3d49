"""Whether a session runs in the reproducible mode (models/invariant.py), and why: as asked,
else this device's default, chosen by what the mode costs there (docs/benchmark-log.md,
"Reproducible greedy"). Not the mode itself."""

from __future__ import annotations

from engine.events import BadRequest

WORDS = {"auto": None, "on": True, "off": False}  # --reproducible -> LoadRequest.reproducible


def reproducible_of(args) -> bool | None:
    """An argparse namespace's --reproducible as LoadRequest.reproducible (None: auto)."""
    return WORDS[getattr(args, "reproducible", "auto")]


# device type -> (on by default, why); the figures behind each are in docs/benchmark-log.md
DEFAULTS = {
    "cpu": (False, "off by default on a CPU: decode runs as fast, but prefill takes 4-9x "
                   "longer; --reproducible on turns it on"),
    "cuda": (False, "off by default on a GPU: decode runs within 2%, but bf16 prefill takes "
                    "17-24x longer; --reproducible on turns it on"),
}


def reproducible_for(requested: bool | None, device_type: str, *, family_step: bool,
                     world_size: int = 1, compile_layers: bool = False, model_type: str = ""
                     ) -> tuple[bool, str]:
    """(on, why) for a load. `family_step`: the model runs the engine's own step (the mode's
    pieces live there). Asked for where it cannot run: BadRequest naming why."""
    why_not = None
    if not family_step:
        why_not = (f"{model_type or 'this model'} runs through transformers' modules (the "
                   f"mode needs the engine's own step)")
    elif world_size > 1:
        why_not = "tensor parallelism sums over ranks in an order of its own"
    elif compile_layers:
        why_not = "--compile's fused pieces round differently from the eager ones prefill runs"
    if requested is False:
        return False, "as asked"
    if why_not is not None:
        if requested:
            raise BadRequest(f"--reproducible on cannot run here: {why_not}")
        return False, why_not
    if requested:
        return True, "as asked"
    return DEFAULTS.get(device_type, (False, "off on this device"))
