"""On a real card: a capped load, then an uncapped one that needs more than the cap, succeeds
(the cap was its load's only). The CPU-side logic is test_memory_limit.py's."""

from __future__ import annotations

import io
import threading

import pytest
import torch

from engine.cli.worker import Worker
from engine.events import GenerateRequest, LoadRequest, SamplingParams, event_from_json
from engine.generate.session import Session

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GiB = 2**30
CAP_GIB = 2.0


def _fraction() -> float:
    return torch.cuda.get_per_process_memory_fraction(torch.cuda.current_device())


def _allocates(num_bytes: int) -> bool:
    try:
        block = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        return False
    del block
    torch.cuda.empty_cache()
    return True


def _run(worker: Worker, req) -> list:
    start = worker.out.tell()
    worker._run(req, threading.Event())
    worker.out.seek(start)
    events = [event_from_json(line) for line in worker.out.read().splitlines()]
    worker.out.seek(0, io.SEEK_END)
    return events


def test_worker_capped_load_then_uncapped_load_that_needs_more(tiny_model):
    worker = Worker(io.StringIO())
    # the engine's default context on the tiny model is 2,048: a bigger context than the cap
    # holds is what an uncapped load "that fits" needs; 3 GiB of plain allocation stands in
    capped = _run(worker, LoadRequest(str(tiny_model), device="cuda", memory_limit_gib=CAP_GIB))
    assert capped[-1].name == "loaded", capped[-1]
    assert _fraction() < 1.0 and not _allocates(3 * GiB)

    uncapped = _run(worker, LoadRequest(str(tiny_model), device="cuda"))
    assert uncapped[-1].name == "loaded", uncapped[-1]
    assert _fraction() == 1.0 and _allocates(3 * GiB)
    gen = GenerateRequest(prompt="hi", raw=True, max_new_tokens=4,
                          sampling=SamplingParams(temperature=0.0))
    assert _run(worker, gen)[-1].name == "finished"

    _run(worker, LoadRequest(str(tiny_model), device="cuda", memory_limit_gib=CAP_GIB))
    assert _fraction() < 1.0
    worker._unload()
    assert _fraction() == 1.0 and _allocates(3 * GiB)


def test_session_load_without_a_limit_after_a_capped_one(tiny_model):
    capped = Session.load(LoadRequest(str(tiny_model), device="cuda", memory_limit_gib=CAP_GIB))
    assert _fraction() < 1.0
    del capped
    Session.load(LoadRequest(str(tiny_model), device="cuda"))
    assert _fraction() == 1.0 and _allocates(3 * GiB)
