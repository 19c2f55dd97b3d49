"""A model's sampling defaults: what a generation uses for each setting its request leaves unset.
Each setting comes from the model's generation_config.json where that names it, else from its
family's preset (formats/families), else from the engine's own default. No torch: the Loaded
event carries them to the window, which shows them as the conversation's defaults.
"""

from __future__ import annotations

from engine.formats import families

SETTINGS = ("temperature", "top_p", "top_k", "repetition_penalty")
ENGINE_DEFAULTS = {"temperature": 0.7, "top_p": 0.95, "top_k": 0, "repetition_penalty": 1.0}
GENERATION_CONFIG = "generation_config.json"
ENGINE = "Hearth's defaults"


def model_defaults(gen_config: dict, model_type: str | None) -> dict:
    """{setting: value for each of SETTINGS, "source": where they came from, in words}.

    generation_config.json's `do_sample: false` means greedy (temperature 0); any sampling value
    it names counts even without `do_sample: true` (transformers would ignore it there and stay
    greedy; the file's author named it to be used). Values were checked at load
    (files/tokenizer_files.py check_generation_config)."""
    family = families.get(model_type)
    preset = family.sampling if family is not None else None
    out, sources = {}, []
    for key in SETTINGS:
        if key == "temperature" and gen_config.get("do_sample") is False:
            value, source = 0.0, GENERATION_CONFIG
        elif gen_config.get(key) is not None:
            value, source = gen_config[key], GENERATION_CONFIG
        elif preset is not None and getattr(preset, key) is not None:
            value, source = getattr(preset, key), f"the {family.name} family's preset"
        else:
            value, source = ENGINE_DEFAULTS[key], ENGINE
        out[key] = int(value) if key == "top_k" else float(value)
        if source not in sources:
            sources.append(source)
    out["source"] = " and ".join(filter(None, (", ".join(sources[:-1]), sources[-1])))
    return out


def describe(defaults: dict) -> str:
    """'temperature 0.2, top-p 0.9, top-k off, repetition penalty 1.0 (from ...)': a load note."""
    top_k = defaults["top_k"] or "off"
    return (f"sampling defaults: temperature {defaults['temperature']:g}, top-p "
            f"{defaults['top_p']:g}, top-k {top_k}, repetition penalty "
            f"{defaults['repetition_penalty']:g} (from {defaults['source']}); a request's own "
            "values come first")
