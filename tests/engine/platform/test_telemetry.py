"""The VRAM figure in stats: read from NVML at most every READ_EVERY_S per device, since every
generation of a batch reports stats a few times a second from the engine thread."""

from __future__ import annotations

import torch

from engine.platform import telemetry


def test_nvml_is_read_at_most_every_interval(monkeypatch):
    reads = []
    monkeypatch.setattr(telemetry, "_last", {})
    monkeypatch.setattr(telemetry, "nvml_process_used_bytes",
                        lambda device: reads.append(device) or 1000 * len(reads))
    clock = iter([10.0, 10.1, 10.4, 10.6, 10.7])
    monkeypatch.setattr(telemetry, "_clock", lambda: next(clock))
    cuda = torch.device("cuda", 0)
    assert [telemetry.vram_used_bytes(cuda) for _ in range(5)] == [1000, 1000, 1000, 2000, 2000]
    assert len(reads) == 2
    assert telemetry.vram_used_bytes(torch.device("cpu")) == 0
