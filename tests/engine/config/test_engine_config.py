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
    assert overrides.pdl({}) == "auto" and overrides.pdl({overrides.PDL: "off"}) == "off"
    monkeypatch.setenv(overrides.PDL, "fast")
    with pytest.raises(ValueError, match="HEARTH_PDL must be one of auto, products, off, "
                                         "not 'fast'"):
        Session.load(LoadRequest(str(tiny_model), device="cpu", num_speculative_tokens=None))


def test_backends_travel_as_json_and_refuse_bad_values():
    b = Backends(decode_attention="sdpa", decode_attention_launch=(("waves", 3),),
                 kernel_prefill="all")
    assert Backends.from_json(b.to_json()) == b
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

    monkeypatch.setattr(decode_attention, "attend",
                        lambda q, kv, pos, n, sc, how, launch=None: decode_attention.reference(
                            q, kv, pos, n, sc))  # a kernel that agrees with the reference
    lm = Session.load(LoadRequest(str(tiny_model), device="cpu")).lm
    healthy = Session(lm, "int8")
    assert healthy.cache.decode_attention == "triton"

    def broken(*args, **kwargs):
        raise RuntimeError("out of resources")

    monkeypatch.setattr(decode_attention, "attend", broken)
    sick = Session(lm, "int8")
    assert sick.cache.decode_attention == "reference"
    assert sick.loaded_event().config["failed_kernels"]
    assert healthy.cache.decode_attention == "triton"
