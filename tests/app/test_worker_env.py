"""The worker process is started with NVLink multicast off (it is rank 0 of tensor parallelism
and the parent of the other ranks), whatever the app's own environment or extra settings say."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.platform.child_env import NO_MULTICAST


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc (Linux)")
def test_the_worker_starts_with_multicast_off(qtbot, make_worker, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # the app's own environment says otherwise
    worker = make_worker(TORCH_SYMM_MEM_DISABLE_MULTICAST="0", HEARTH_FAKE_DELAY_S="0.002")
    with qtbot.waitSignal(worker.sig_started, timeout=10_000):
        worker.start()
    raw = Path(f"/proc/{worker.pid}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
    assert {k: env.get(k) for k in NO_MULTICAST} == NO_MULTICAST
    assert env["HEARTH_FAKE_DELAY_S"] == "0.002"  # the other extra settings still travel
