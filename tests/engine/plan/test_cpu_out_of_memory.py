"""Out of memory on the CPU: the allocator's RuntimeError or a MemoryError, at
load or mid-answer, gets the same kind of hint as on the GPU (a format and a context that fit the
computer's free memory), not a raw allocator message. The failure is the real CPU allocator's:
an allocation far past any machine's memory, injected where the load or the step runs."""

from __future__ import annotations

import json

import pytest
import torch

from engine.cli import cli
from engine.events import Failed, Finished, LoadRequest
from engine.generate.session import Session
from engine.load import loader
from engine.plan import oom
from engine.plan.oom import OutOfMemory
from tests.engine.helpers import REPO, greedy_request, token_ids

QWEN_7B = json.loads((REPO / "bench/qwen2.5-7b/config.json").read_text())
GIB = 1 << 30


def _allocator_failure():
    """What torch's CPU allocator raises: a RuntimeError, not torch.OutOfMemoryError."""
    try:
        torch.empty(2**60, dtype=torch.uint8)
    except RuntimeError as e:
        return e
    pytest.skip("this machine allocated 2**60 bytes")


def _failing_once(monkeypatch, target, name, error):
    real, calls = getattr(target, name), []

    def fake(*a, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise error
        return real(*a, **kw)
    monkeypatch.setattr(target, name, fake)


def test_allocator_errors_are_told_apart_from_other_errors():
    assert oom.memory_kind(_allocator_failure()) == "CPU"
    assert oom.memory_kind(MemoryError()) == "CPU"
    assert oom.memory_kind(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate")) == \
        "GPU"
    assert oom.memory_kind(RuntimeError("shape mismatch")) is None
    assert oom.memory_kind(ValueError("out of memory")) is None


def test_cpu_hint_names_a_format_and_context_that_fit_the_ram():
    # 7B in fp32 (30 GB) with 12 GiB free: a smaller format, like the GPU hint
    assert oom.hint(QWEN_7B, "fp32", 32768, 12 * GIB, on_cpu=True).startswith("try --quant ")
    assert "GiB of free memory" in oom.hint(QWEN_7B, "fp32", 32768, GIB // 2, on_cpu=True)


@pytest.mark.parametrize("error", [_allocator_failure, MemoryError])
def test_load_out_of_cpu_memory_raises_out_of_memory_with_a_hint(error, tiny_model,
                                                                  monkeypatch):
    _failing_once(monkeypatch, loader, "load", error())
    with pytest.raises(OutOfMemory) as info:
        Session.load(LoadRequest(str(tiny_model), device="cpu"))
    assert str(info.value) == "the model does not fit in this computer's memory (RAM)"
    assert info.value.hint.startswith(("try ", "this model needs"))


def test_cli_load_out_of_cpu_memory_is_one_line_with_the_hint(tiny_model, monkeypatch, capsys):
    _failing_once(monkeypatch, loader, "load", _allocator_failure())
    code = cli.main(["run", "--model", str(tiny_model), "--device", "cpu", "--prompt", "hi",
                     "--raw", "--max-new-tokens", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("hearth: the model does not fit in this computer's memory (RAM) (")
    assert "alloc_cpu" not in err[0] and "DefaultCPUAllocator" not in err[0]


def test_generation_out_of_cpu_memory_fails_once_with_a_hint(tiny_model, monkeypatch):
    session = Session.load(LoadRequest(str(tiny_model), device="cpu"))
    reference = token_ids(list(session.generate(greedy_request(n=8))))
    _failing_once(monkeypatch, session.decoder, "forward", _allocator_failure())
    events = list(session.generate(greedy_request(n=8)))
    assert [type(e) for e in events].count(Failed) == 1 and isinstance(events[-1], Failed)
    assert events[-1].error == "the computer (RAM) ran out of memory during generation"
    assert events[-1].hint and not events[-1].bad_input
    again = list(session.generate(greedy_request(n=8)))
    assert isinstance(again[-1], Finished) and token_ids(again) == reference
