"""The configuration a load resolves once: developer overrides read in one place, backend
settings validated, the Loaded event carrying the choices, kernel health per session."""

from __future__ import annotations

import pytest

from engine.config import overrides
from engine.config.backends import Backends
from engine.events import Loaded, LoadRequest, event_from_json, event_to_json
from engine.generate.session import Session
from engine.kernels import attention_backend


def test_overrides_are_read_from_the_given_environment():
    b = overrides.backends({overrides.DECODE_ATTENTION: "reference",
                            overrides.KERNEL_PREFILL: "512", overrides.FUSED_OPS: "off",
                            overrides.INT4_KERNEL: "triton",
                            overrides.DECODE_ATTENTION_CONFIG: '{"waves": 4, "block_n": 32}'})
    assert (b.decode_attention, b.kernel_prefill, b.fused_ops, b.int4_kernel) == (
        "reference", 512, "off", "triton")
    assert b.launch == {"block_n": 32, "waves": 4}
    assert overrides.backends({}) == Backends()
    assert overrides.backends({overrides.KERNEL_PREFILL: "all"}).kernel_prefill_bound(7) > 1e9
    assert Backends().kernel_prefill_bound(7) == 7


@pytest.mark.parametrize("name, value", [(overrides.DECODE_ATTENTION, "fast"),
                                         (overrides.DECODE_ATTENTION_CONFIG, "[1]"),
                                         (overrides.TP_ALL_REDUCE, "fastest")])
def test_a_bad_override_names_its_variable(name, value):
    with pytest.raises(ValueError, match=name):
        overrides.backends({name: value})


def test_a_bad_launch_override_fails_the_load_in_one_line(tiny_model, monkeypatch):
    assert overrides.backends({}).pdl == "auto"
    assert overrides.backends({overrides.PDL: "off"}).pdl == "off"
    monkeypatch.setenv(overrides.PDL, "fast")
    with pytest.raises(ValueError, match="HEARTH_PDL must be one of auto, products, off, "
                                         "not 'fast'"):
        Session.load(LoadRequest(str(tiny_model), device="cpu", num_speculative_tokens=None))


def test_backends_travel_as_json_and_refuse_bad_values():
    b = Backends(decode_attention="sdpa", decode_attention_launch=(("waves", 3),),
                 kernel_prefill="all", int4_prefill="unpack", int4_rows="fixed",
                 prefill_graphs="off", pdl="products")
    assert Backends.from_json(b.to_json()) == b  # a tensor-parallel follower's, whole
    with pytest.raises(ValueError, match="kernel_prefill"):
        Backends(kernel_prefill=-1)


def test_the_loaded_event_reports_the_resolved_configuration(tiny_model, monkeypatch):
    monkeypatch.setenv(overrides.DECODE_ATTENTION, "reference")
    s = Session.load(LoadRequest(str(tiny_model), device="cpu", num_speculative_tokens=None))
    monkeypatch.delenv(overrides.DECODE_ATTENTION)  # read once, at load: the session keeps it
    assert s.config.backends.decode_attention == "reference"
    assert s.cache.decode_attention == "reference"
    event = s.loaded_event()
    assert event.config["decode_attention"] == "reference"
    assert event.config["prefill_chunk"] == s.prefill_chunk
    assert event.config["kv_dtype"] == s.kv_dtype == event.kv_dtype
    assert any(n.startswith("configuration: ") for n in event.notes)
    back = event_from_json(event_to_json(event))
    assert isinstance(back, Loaded) and back.config == event.config


def test_kernel_health_is_per_session(tiny_model, monkeypatch):
    """A kernel that fails one session's load check leaves another session's choice alone."""
    monkeypatch.setattr(attention_backend, "choose", lambda *args: "triton")
    from engine.attention import decode_attention

    monkeypatch.setattr(decode_attention, "kernel",
                        lambda q, kv, pos, n, sc, launch=None: decode_attention.reference(
                            q, kv, pos, n, sc))  # a kernel that agrees with the reference
    lm = Session.load(LoadRequest(str(tiny_model), device="cpu")).lm
    healthy = Session(lm, "int8")
    assert healthy.cache.decode_attention == "triton"

    def broken(*args, **kwargs):
        raise RuntimeError("out of resources")

    monkeypatch.setattr(decode_attention, "kernel", broken)
    sick = Session(lm, "int8")
    assert sick.cache.decode_attention == "reference"
    assert sick.loaded_event().config["failed_kernels"]
    assert healthy.cache.decode_attention == "triton"


def test_the_knobs_read_at_use_are_resolved_at_load(tiny_model, monkeypatch):
    """HEARTH_INT4_PREFILL, HEARTH_INT4_ROWS, HEARTH_PREFILL_GRAPHS and HEARTH_PDL are read
    once, at load, into the session's Backends; the PDL setting the kernels launch under is the
    load's, whatever the environment says afterwards."""
    from engine.platform import nvrtc

    monkeypatch.setattr(nvrtc, "_pdl", "auto")  # this process's, restored after the test
    knobs = {overrides.INT4_PREFILL: "unpack", overrides.INT4_ROWS: "fixed",
             overrides.PREFILL_GRAPHS: "off", overrides.PDL: "products"}
    for name, value in knobs.items():
        monkeypatch.setenv(name, value)
    s = Session.load(LoadRequest(str(tiny_model), device="cpu"))
    for name in knobs:
        monkeypatch.delenv(name)
    b = s.config.backends
    assert (b.int4_prefill, b.int4_rows, b.prefill_graphs, b.pdl) == (
        "unpack", "fixed", "off", "products")
    assert s.cache.backends == b  # what the decode step reads them from
    assert nvrtc.pdl_mode() == "products"
    assert s.loaded_event().config["backends"]["prefill_graphs"] == "off"


def test_int4_layers_take_the_loads_prefill_setting(tiny_awq):
    from engine.config.backends import Backends
    from engine.files.model_folder import check
    from engine.load import loader
    from engine.quant.int4_linear import Int4Linear

    folder = check(str(tiny_awq["qwen2"]["awq"]))
    req = LoadRequest(str(folder.path), device="cpu")
    for setting, fused in (("fused", True), ("unpack", False)):
        lm = loader.load(folder, req, lambda e: None, backends=Backends(int4_prefill=setting))
        layers = [m for m in lm.model.modules() if isinstance(m, Int4Linear)]
        assert layers and all(m.fused_prefill is fused for m in layers)
