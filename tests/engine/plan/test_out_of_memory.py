"""Out of GPU memory, at load or mid-generation, ends in one Failed with a hint the planner says
fits, and the session or worker stays usable. The GPU is simulated: an allocation that raises
torch.OutOfMemoryError; the real thing is exercised on a GPU (bench/plan_check.py)."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import pytest
import torch

from engine.cli import cli
from engine.cli.worker import Worker
from engine.events import Failed, Finished, LoadRequest, event_from_json
from engine.generate.session import Session
from engine.load import loader
from engine.plan import oom
from engine.plan.oom import OutOfMemory
from tests.engine.helpers import REPO, greedy_request, token_ids

QWEN_7B = json.loads((REPO / "bench/qwen2.5-7b/config.json").read_text())
GIB = 1 << 30


def test_hint_names_the_format_and_context_that_fit_the_card():
    # 7B in bf16 (15.2 GB of weights) on an 8 GiB card: the planner's NF4 at 32K, say
    assert oom.hint(QWEN_7B, "bf16", 32768, 8 * GIB, (8, 9)) == \
        "try --quant nf4 with a context of 32K tokens"
    # on a card where bf16 weights fit but not the context asked for: a shorter context
    h = oom.hint(QWEN_7B, "bf16", 32768, 17 * GIB, (8, 9))
    assert h.startswith("try ") and "context of" in h
    assert "needs a card of at least" in oom.hint(QWEN_7B, "bf16", 32768, 2 * GIB, (8, 9))


def _failing_once(monkeypatch, target, name):
    real, calls = getattr(target, name), []

    def fake(*a, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*a, **kw)
    monkeypatch.setattr(target, name, fake)
    return calls


def test_worker_reports_a_load_out_of_memory_and_loads_again(tiny_model, monkeypatch):
    _failing_once(monkeypatch, loader, "load")
    out = io.StringIO()
    worker = Worker(out)
    worker._run(LoadRequest(str(tiny_model), device="cpu"), threading.Event())
    worker._run(LoadRequest(str(tiny_model), device="cpu"), threading.Event())
    events = [event_from_json(line) for line in out.getvalue().splitlines()]
    terminal = [e for e in events if e.name in ("finished", "loaded", "failed")]
    assert [e.name for e in terminal] == ["failed", "loaded"]
    assert terminal[0].error == "the model does not fit in this GPU's memory"
    assert terminal[0].hint and not terminal[0].bad_input


def test_session_load_raises_out_of_memory_with_a_hint(tiny_model, monkeypatch):
    _failing_once(monkeypatch, loader, "load")
    with pytest.raises(OutOfMemory) as info:
        Session.load(LoadRequest(str(tiny_model), device="cpu"))
    assert info.value.hint


def test_generation_out_of_memory_fails_once_and_the_next_turn_works(tiny_model, monkeypatch):
    session = Session.load(LoadRequest(str(tiny_model), device="cpu"))
    reference = token_ids(list(session.generate(greedy_request(n=12))))
    _failing_once(monkeypatch, session.decoder, "forward")
    events = list(session.generate(greedy_request(n=12)))
    assert isinstance(events[-1], Failed) and events[-1].hint
    assert [type(e) for e in events].count(Failed) == 1
    assert "out of memory" in events[-1].error
    again = list(session.generate(greedy_request(n=12)))
    assert isinstance(again[-1], Finished) and token_ids(again) == reference


def test_cli_run_prints_one_line_with_the_hint(tiny_model, monkeypatch, capsys):
    _failing_once(monkeypatch, loader, "load")
    code = cli.main(["run", "--model", str(Path(tiny_model)), "--device", "cpu", "--prompt",
                     "hi", "--raw", "--max-new-tokens", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("hearth: the model does not fit in this GPU's memory (try ")


def test_the_emulated_cards_context_is_this_process_alone():
    """--memory-limit subtracts this process's memory outside torch's allocator: with NVML, its
    per-process figure; other processes on the card (seen in device-wide free memory) do not
    shrink the emulated card. Figures from a 140 GiB GPU: 518 MiB of bare context, 40 GiB in use by
    other processes."""
    total, reserved, mib = 140 * GIB, 0, 1 << 20
    free = total - 518 * mib - 40 * GIB
    assert loader.cuda_context_bytes(total, free, reserved, 518 * mib) == 518 * mib
    assert loader.cuda_context_bytes(total, free, reserved, None) == 518 * mib + 40 * GIB
