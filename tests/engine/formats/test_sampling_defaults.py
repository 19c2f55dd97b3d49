"""A model's sampling defaults, setting by setting: its generation_config.json where that names
the setting, else its family's preset, else the engine's own; every preset a value the sampler
takes."""

from __future__ import annotations

import dataclasses

import pytest

from engine.events import SamplingParams
from engine.formats import families
from engine.formats.sampling_defaults import ENGINE_DEFAULTS, SETTINGS, describe, model_defaults


def values(defaults: dict) -> tuple:
    return tuple(defaults[k] for k in SETTINGS)


def test_generation_config_wins_setting_by_setting():
    gen = {"do_sample": True, "temperature": 0.6, "top_k": 50}
    d = model_defaults(gen, "qwen2")
    # temperature and top_k: the file's; top_p: Qwen2's preset; the penalty: the engine's
    assert values(d) == (0.6, 0.8, 50, ENGINE_DEFAULTS["repetition_penalty"])
    assert d["source"] == ("generation_config.json, the Qwen2 family's preset and Hearth's "
                           "defaults")


def test_do_sample_false_is_greedy_and_named_values_count_without_do_sample():
    assert model_defaults({"do_sample": False, "temperature": 0.9}, "llama")["temperature"] == 0
    # transformers would stay greedy here; the file named a temperature to be used
    assert model_defaults({"temperature": 0.4}, "llama")["temperature"] == 0.4


def test_a_folder_without_sampling_takes_its_family_preset():
    # SmolLM2's GGUF import: a Llama with eos ids only in generation_config.json
    d = model_defaults({"eos_token_id": 2}, "llama")
    assert values(d) == (0.2, 0.9, 0, 1.0)
    assert d["source"] == "the Llama family's preset and Hearth's defaults"
    assert model_defaults({}, "phi3")["temperature"] == 0.0  # greedy, as its card generates


def test_an_unknown_family_takes_the_engine_defaults():
    for model_type in ("gemma", "mamba", None):
        d = model_defaults({}, model_type)
        assert values(d) == tuple(ENGINE_DEFAULTS[k] for k in SETTINGS)
        assert d["source"] == "Hearth's defaults"


def test_types_are_the_samplers():
    d = model_defaults({"do_sample": True, "top_k": 20, "temperature": 1}, "qwen3")
    assert type(d["top_k"]) is int and type(d["temperature"]) is float


@pytest.mark.parametrize("family", families.registered(), ids=lambda f: f.model_type)
def test_every_preset_is_a_valid_request(family):
    preset = dataclasses.asdict(family.sampling)
    SamplingParams(**preset).validate()  # raises BadRequest on a value the sampler refuses
    assert set(preset) == set(SETTINGS)


def test_describe_is_one_note():
    note = describe(model_defaults({}, "llama"))
    assert note.startswith("sampling defaults: temperature 0.2, top-p 0.9, top-k off")
    assert "Llama family's preset" in note and "\n" not in note
