"""What transformers would paper over in a checked folder, refused in one sentence instead: a
RoPE type it has no function for (a KeyError deep inside the rotary embedding's set-up), and a
weight the checkpoint lacks (filled with random values, under a warning table)."""

from __future__ import annotations

import json

from engine.events import BadRequest
from engine.files.model_folder import ModelFolder

ROPE_KEYS = ("rope_scaling", "rope_parameters")
# spellings transformers turns into one of its types before it looks one up (Phi-3's "su")
ROPE_ALIASES = ("default", "su")


def check_rope(folder: ModelFolder) -> None:
    """Every RoPE type config.json names (one dict, or one per layer type) must be one the
    installed transformers computes."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    known = (*ROPE_ALIASES, *ROPE_INIT_FUNCTIONS)
    config = folder.config
    text = config.get("text_config")
    for source in (config, text if isinstance(text, dict) else {}):
        for key in ROPE_KEYS:
            for rope in _rope_dicts(source.get(key)):
                kind = rope.get("rope_type", rope.get("type", "default"))
                if kind not in known:
                    raise BadRequest(
                        f"{folder.path / 'config.json'} has {key} of type "
                        f"{json.dumps(kind)[:40]}, which transformers does not know (it knows "
                        f"{', '.join(sorted(set(known) - {'su'}))})")


def _rope_dicts(value) -> list[dict]:
    """One RoPE dict, or the dicts of one nested by layer type; anything else holds none."""
    if not isinstance(value, dict):
        return []
    if "rope_type" in value or "type" in value or not all(
            isinstance(v, dict) or v is None for v in value.values()):
        return [value]
    return [v for v in value.values() if isinstance(v, dict)]


def refuse_missing_weights(model, loading_info: dict, folder: ModelFolder) -> None:
    """A parameter the model needs that no weight file holds: transformers has filled it with
    random values, so the model would answer on made-up weights. Names the first one, in the
    model's own order."""
    missing = set(loading_info.get("missing_keys") or ())
    if not missing:
        return
    ordered = [n for n, _ in model.named_parameters() if n in missing] or sorted(missing)
    more = f" and {len(missing) - 1:,} more" if len(missing) > 1 else ""
    raise BadRequest(f"{folder.path} lacks the weight {ordered[0]}{more}: no .safetensors file "
                     "holds it (an incomplete download?)")
