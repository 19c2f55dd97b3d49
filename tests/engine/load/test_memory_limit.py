"""A --memory-limit belongs to its load: the next load without one, and an unload, give the
allocator the whole card back (torch's memory fraction is per process and outlives a load).
CPU-side: torch.cuda's allocator calls are recorded, not made; test_memory_limit_gpu.py runs
the same sequence on a real card."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import torch

from engine.cli.worker import Worker
from engine.load import loader
from engine.platform import telemetry

GiB = 2**30
CARD = torch.device("cuda", 0)


@pytest.fixture
def fractions(monkeypatch):
    """[(fraction, device index)] as set_per_process_memory_fraction is called, on a fake
    80 GiB card whose CUDA context takes 0.5 GiB."""
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda f, device=None: calls.append((f, torch.device(device).index)))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (79 * GiB, 80 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(telemetry, "nvml_process_used_bytes", lambda device: GiB // 2)
    return calls


def test_a_load_without_a_limit_lifts_the_last_loads_cap(fractions):
    loader.apply_memory_limit(CARD, 8.0)
    assert fractions == [(pytest.approx(7.5 / 80), 0)]
    loader.apply_memory_limit(CARD, None)
    assert fractions[-1] == (1.0, 0)
    loader.apply_memory_limit(torch.device("cuda"), 4.0)  # "cuda": the current device's index
    assert fractions[-1] == (pytest.approx(3.5 / 80), 0)


def test_an_unload_lifts_its_loads_cap(fractions):
    worker = Worker(io.StringIO())
    worker.session = SimpleNamespace(lm=SimpleNamespace(device=torch.device("cuda", 1)))
    worker._unload()
    assert worker.session is None and fractions == [(1.0, 1)]


def test_the_cpu_has_no_cap_to_set_or_lift(fractions):
    loader.apply_memory_limit(torch.device("cpu"), 8.0)
    loader.apply_memory_limit(torch.device("cpu"), None)
    worker = Worker(io.StringIO())
    worker.session = SimpleNamespace(lm=SimpleNamespace(device=torch.device("cpu")))
    worker._unload()
    assert fractions == []
