"""GPU detection through a mocked NVML (this machine has no driver), and `hearth gpu`."""

from __future__ import annotations

import json
import sys
import types
from types import SimpleNamespace

import pytest

from engine.platform.gpu import GpuReport, detect_gpus, process_used_bytes
from engine.tools import plan_report

GiB = 1 << 30


def fake_nvml(gpus=(), init_error=None, procs=(), bad_index=None):
    """A stand-in for the pynvml module; `calls` records init/shutdown pairing."""
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    m.NVMLError = NVMLError
    for name in ("LibraryNotFound", "DriverNotLoaded", "GpuIsLost", "NoPermission"):
        setattr(m, f"NVMLError_{name}", type(f"NVMLError_{name}", (NVMLError,), {}))
    m.calls = []

    def init():
        if init_error:
            raise getattr(m, f"NVMLError_{init_error}")("NVML Shared Library Not Found")
        m.calls.append("init")

    def handle(i):
        if i == bad_index:
            raise m.NVMLError_GpuIsLost("GPU is lost")
        if i >= len(gpus):
            raise m.NVMLError("Invalid Argument")
        return i

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlSystemGetDriverVersion = lambda: "570.86.15"
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = handle
    m.nvmlDeviceGetName = lambda h: gpus[h]["name"].encode()  # old pynvml: bytes
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h:04d}"
    m.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(
        total=gpus[h]["total"], free=gpus[h]["free"], used=gpus[h]["total"] - gpus[h]["free"])
    m.nvmlDeviceGetCudaComputeCapability = lambda h: gpus[h]["cc"]
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [SimpleNamespace(**p) for p in procs]
    return m


H200 = {"name": "NVIDIA H200", "total": 141 * GiB, "free": 140 * GiB, "cc": (9, 0)}
RTX3090 = {"name": "NVIDIA GeForce RTX 3090", "total": 24 * GiB, "free": 23 * GiB, "cc": (8, 6)}
T4 = {"name": "Tesla T4", "total": 15 * GiB, "free": 15 * GiB, "cc": (7, 5)}


@pytest.fixture
def nvml(monkeypatch):
    def install(**kw):
        m = fake_nvml(**kw)
        monkeypatch.setitem(sys.modules, "pynvml", m)
        return m
    return install


def test_detects_every_gpu(nvml):
    m = nvml(gpus=(H200, RTX3090, T4))
    r = detect_gpus()
    assert m.calls == ["init", "shutdown"]
    assert [g.name for g in r.gpus] == ["NVIDIA H200", "NVIDIA GeForce RTX 3090", "Tesla T4"]
    h, a, t = r.gpus
    assert (h.supports_bf16, h.supports_fp8, h.compute_capability) == (True, True, (9, 0))
    assert (a.supports_bf16, a.supports_fp8) == (True, False)
    assert (t.supports_bf16, t.supports_fp8) == (False, False)
    assert (a.total_bytes, a.free_bytes, a.used_bytes) == (24 * GiB, 23 * GiB, GiB)
    assert h.driver_version == "570.86.15" and h.uuid == "GPU-0000" and r.reason is None
    d = json.loads(json.dumps(r.to_dict()))
    assert d["cpu_mode"] is False and d["gpus"][0]["compute_capability"] == [9, 0]


def test_no_driver_is_cpu_mode(nvml):
    nvml(init_error="LibraryNotFound")
    r = detect_gpus()
    assert r == GpuReport((), r.reason) and r.cpu_mode
    assert "no NVIDIA driver" in r.reason and "CPU mode" in r.reason


def test_driver_not_loaded_and_no_gpu(nvml):
    nvml(init_error="DriverNotLoaded")
    assert "not loaded" in detect_gpus().reason
    m = nvml(gpus=())
    r = detect_gpus()
    assert r.cpu_mode and "sees no GPU" in r.reason and m.calls == ["init", "shutdown"]


def test_a_lost_gpu_does_not_hide_the_others(nvml):
    nvml(gpus=(H200, H200), bad_index=0)
    r = detect_gpus()
    assert [g.index for g in r.gpus] == [1] and "GPU 0" in r.reason


def test_pynvml_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert "not installed" in detect_gpus().reason
    assert process_used_bytes(123) is None


def test_real_nvml_never_raises():
    r = detect_gpus()  # on this machine: no driver; on a GPU machine: its GPUs
    assert isinstance(r, GpuReport) and (r.gpus or r.reason)


def test_process_used_bytes(nvml):
    m = nvml(gpus=(H200,), procs=[{"pid": 41, "usedGpuMemory": 3 * GiB},
                                  {"pid": 42, "usedGpuMemory": None},
                                  {"pid": 43, "usedGpuMemory": 2**64 - 1}])
    assert process_used_bytes(41) == 3 * GiB
    assert process_used_bytes(42) is None and process_used_bytes(43) is None
    assert process_used_bytes(99) is None  # not on the GPU (or a container's PID)
    assert process_used_bytes(41, index=5) is None
    assert m.calls.count("init") == m.calls.count("shutdown") == 5
    nvml(init_error="LibraryNotFound")
    assert process_used_bytes(41) is None


def test_hearth_gpu_without_driver(nvml, capsys):
    nvml(init_error="LibraryNotFound")
    assert plan_report.run_gpu(as_json=False) == 0
    assert "No NVIDIA GPU" in capsys.readouterr().out
    assert plan_report.run_gpu(as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"] == [] and out["cpu_mode"] is True and "driver" in out["reason"]


def test_hearth_gpu_lists_cards(nvml, capsys):
    nvml(gpus=(RTX3090,))
    assert plan_report.run_gpu() == 0
    out = capsys.readouterr().out
    assert "RTX 3090" in out and "8.6" in out


def test_plan_with_gpu_auto(nvml, tmp_path, capsys):
    from tests.test_plan import QWEN7B

    (tmp_path / "config.json").write_text(json.dumps(QWEN7B))
    nvml(gpus=(T4,))  # Turing: fp16, no bf16; plans against the free memory
    assert plan_report.run_plan(str(tmp_path), gpu="auto", context=4096, as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["vram_bytes"] == 15 * GiB and out["card"]["name"] == "Tesla T4"
    assert out["recommended"]["quant"] in ("fp16", "nf4") and out["quant"] != "bf16"
    nvml(init_error="LibraryNotFound")  # no GPU: a CPU plan, not an error
    assert plan_report.run_plan(str(tmp_path), gpu="auto", as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["recommended"]["device"] == "cpu"
    nvml(gpus=(T4,))
    assert plan_report.run_plan(str(tmp_path), gpu="3") == 2
