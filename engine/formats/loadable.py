"""Whether Hearth loads a model, from its config.json alone: the one rule the loader
(files/model_folder.check), the planner (a model it refuses never fits), `hearth plan`,
`hearth list`, the Hub listing and the app's picker all read, so none of them offers a model
the loader then refuses. The planner sizes more families than load (families/planned.py, a
mixture of experts sized like its dense family): sizing is not loading. No torch here."""

from __future__ import annotations

import json

from engine.formats import families


class NotLoadable(ValueError):
    """One sentence: why a load refuses this config.json."""


def architecture(config: dict) -> str:
    """The transformers class a load builds: config.json's first `architectures` entry, else
    the class of the family its model_type names. Raises NotLoadable where `architectures` is
    not a list of class names."""
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(
            isinstance(a, str) for a in archs)):
        raise NotLoadable(f"config.json has architectures = {json.dumps(archs)[:40]}; it must "
                          "be a list of class names")
    if archs:
        return archs[0]
    model_type = config.get("model_type")
    for cls, family in families.ARCHITECTURES.items():
        if family == model_type:
            return cls
    return str(model_type or "unknown (config.json names none)")


def refusal(config: dict) -> str | None:
    """Why a load refuses this config.json's model, in one sentence; None where it loads."""
    if not isinstance(config, dict):
        return "config.json does not hold a JSON object"
    try:
        arch = architecture(config)
    except NotLoadable as e:
        return str(e)
    if arch not in families.ARCHITECTURES:
        names = ", ".join(sorted(set(families.ARCHITECTURES.values())))
        return f"architecture {arch} is not supported; Hearth runs {names}"
    return None
