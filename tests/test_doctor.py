"""`hearth doctor`: one plain line per check, a missing package named with its fix, exit 1 only
for what Hearth needs. Missing pieces are simulated; this machine has no GPU and CPU torch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from engine.cli import cli
from engine.platform import display
from engine.platform.gpu import GpuInfo, GpuReport
from engine.tools import doctor
from tests.engine.helpers import REPO

GiB = 1 << 30
NO_GPU = GpuReport((), "no NVIDIA driver is installed (the NVML library was not found); CPU mode")
RTX4090 = GpuReport((GpuInfo(index=0, name="NVIDIA GeForce RTX 4090", uuid="GPU-0",
                             total_bytes=24 * GiB, free_bytes=23 * GiB, used_bytes=GiB,
                             compute_capability=(8, 9), driver_version="550.54.15",
                             supports_bf16=True, supports_fp8=True),))


def _without(monkeypatch, *dists: str) -> None:
    """Simulate uninstalled distributions (doctor reads versions from metadata, never imports)."""
    real = doctor.installed_version
    monkeypatch.setattr(doctor, "installed_version",
                        lambda dist: None if dist in dists else real(dist))


def test_missing_package_is_one_clear_line(monkeypatch, capsys):
    _without(monkeypatch, "bitsandbytes")
    rc = cli.main(["doctor"])
    out = capsys.readouterr().out
    assert rc == 1
    lines = [line for line in out.splitlines() if line.startswith("MISSING")]
    named = [line for line in lines if "bitsandbytes" in line]
    assert len(named) == 1, out
    line = named[0]
    assert line.startswith("MISSING bitsandbytes: not installed")
    assert "Fix: " in line and "-m pip install" in line and sys.executable in line
    assert "bitsandbytes" in out.splitlines()[-1]  # the summary names it too


def test_every_check_is_one_line_with_a_known_status(capsys):
    checks = doctor.run_checks()
    names = [c.name for c in checks]
    for needed in ("Python", "torch", "NVIDIA driver", "bitsandbytes", "gptqmodel", "Triton",
                   "C compiler", "Qt", "Window", "server extra"):
        assert needed in names
    for c in checks:
        assert c.status in (doctor.OK, doctor.NOTE, doctor.MISSING)
        assert "\n" not in c.line()
    rc = doctor.main()
    out = capsys.readouterr().out
    assert rc == (1 if any(c.status == doctor.MISSING for c in checks) else 0), out


def test_optional_gptqmodel_is_a_note_not_a_failure(monkeypatch):
    _without(monkeypatch, "gptqmodel")
    check = doctor.check_gptqmodel()
    assert check.status == doctor.NOTE
    assert "optional" in check.detail and "AWQ" in check.detail
    assert "pip install gptqmodel" in check.line()


def test_no_driver_is_a_note(monkeypatch):
    check = doctor.check_driver(NO_GPU, None)
    assert check.status == doctor.NOTE
    assert "runs on the CPU" in check.line() and "install its driver" in check.line()


def test_driver_with_a_gpu():
    check = doctor.check_driver(RTX4090, (12, 4))
    assert check.status == doctor.OK
    assert "550.54.15, CUDA 12.4" in check.detail and "RTX 4090 (24 GiB)" in check.detail


def test_cpu_torch_on_a_gpu_machine_is_missing_with_the_right_index():
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")
    check = doctor.check_torch(RTX4090, (12, 4), {})
    assert check.status == doctor.MISSING
    assert "CPU build" in check.detail
    assert "--index-url https://download.pytorch.org/whl/cu126" in check.fix
    assert doctor.check_torch(NO_GPU, None, {}).status == doctor.OK


def test_torch_built_for_a_newer_cuda_than_the_driver(monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    check = doctor.check_torch(RTX4090, (12, 4), {})
    assert check.status == doctor.MISSING
    assert "CUDA 13.0" in check.detail and "12.4 at most" in check.detail
    assert "whl/cu126" in check.fix
    assert doctor.check_torch(RTX4090, (13, 0), {}).status == doctor.OK


def test_torch_too_old_for_hearth():
    import torch

    spec = {"torch": ">=99"}
    check = doctor.check_torch(NO_GPU, None, spec)
    assert check.status == doctor.MISSING and f"{torch.__version__} is installed" in check.detail


def test_missing_torch_and_missing_qt(monkeypatch):
    real = doctor.importlib.util.find_spec
    monkeypatch.setattr(doctor.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("torch", "PySide6") else real(name, *a))
    torch_check = doctor.check_torch(NO_GPU, None, {})
    assert torch_check.status == doctor.MISSING
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in torch_check.fix
    qt = doctor.check_qt({"pyside6-essentials": "==6.11.3"})
    assert qt.status == doctor.MISSING and "PySide6-Essentials==6.11.3" in qt.fix


def test_triton_and_compiler_are_notes(monkeypatch):
    _without(monkeypatch, "triton", "triton-windows")
    assert doctor.check_triton(torch_has_cuda=False).status == doctor.NOTE
    on_gpu = doctor.check_triton(torch_has_cuda=True)
    assert on_gpu.status == doctor.NOTE and "pip install triton" in on_gpu.fix
    monkeypatch.setattr(doctor, "find_c_compiler", lambda: None)
    compiler = doctor.check_c_compiler(has_triton=True)
    assert compiler.status == doctor.NOTE and "gcc" in compiler.fix


def test_nvrtc_is_a_note_where_it_is_missing(monkeypatch):
    import torch.cuda._utils as cuda_utils

    assert doctor.check_nvrtc(torch_has_cuda=False).status == doctor.NOTE

    def missing():
        raise OSError("Could not find any NVRTC library")

    monkeypatch.setattr(cuda_utils, "_get_gpu_rtc_library", missing)
    check = doctor.check_nvrtc(torch_has_cuda=True)
    assert check.status == doctor.NOTE and "tinygemm" in check.detail and "torch" in check.fix
    monkeypatch.setattr(cuda_utils, "_get_gpu_rtc_library", lambda: object())
    assert doctor.check_nvrtc(torch_has_cuda=True).status == doctor.OK


@pytest.mark.parametrize("cuda, tag", [(None, "cpu"), ((11, 8), "cpu"), ((12, 0), "cu126"),
                                       ((12, 6), "cu126"), ((12, 8), "cu128"), ((12, 9), "cu128"),
                                       ((13, 0), "cu130"), ((13, 2), "cu130")])
def test_torch_index_follows_the_driver(cuda, tag):
    assert doctor.torch_index_url(cuda) == f"https://download.pytorch.org/whl/{tag}"


def test_importing_doctor_imports_neither_torch_nor_qt():
    code = ("import sys, engine.cli.cli, engine.tools.doctor, engine.tools.desktop_entry; "
            "bad = [m for m in ('torch', 'transformers', 'PySide6') if m in sys.modules]; "
            "sys.exit(str(bad) if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ldd of PySide6 6.11's xcb plugin on a Debian 12 that has the README's old apt line only
LDD_TWO_MISSING = """\
\tlinux-vdso.so.1 (0x00007efe63cf4000)
\tlibQt6XcbQpa.so.6 => /venv/PySide6/Qt/lib/libQt6XcbQpa.so.6 (0x00007efe63000000)
\tlibxcb-cursor.so.0 => /lib/x86_64-linux-gnu/libxcb-cursor.so.0 (0x00007efe63b3c000)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-util.so.1 => /lib/x86_64-linux-gnu/libxcb-util.so.1 (0x00007efe63b34000)
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-randr.so.0 => /lib/x86_64-linux-gnu/libxcb-randr.so.0 (0x00007efe63b1b000)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-keysyms.so.1 => not found
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007efe61e1e000)
"""
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="Qt's X11 plugin and ldd are Linux's")


@linux_only
def test_window_names_each_missing_library_of_the_x11_plugin(monkeypatch, capsys):
    monkeypatch.setattr(display, "ldd", lambda path: LDD_TWO_MISSING)
    rc = cli.main(["doctor"])
    out = capsys.readouterr().out
    assert rc == 1
    line = next(line for line in out.splitlines() if line.startswith("MISSING Window"))
    assert "libxcb-icccm.so.4, libxcb-keysyms.so.1 not found" in line
    assert line.endswith("Fix: sudo apt-get install -y libxcb-icccm4 libxcb-keysyms1")
    assert "Window" in out.splitlines()[-1]


@linux_only
def test_window_with_its_plugin_away_from_qts_own_libraries(monkeypatch, tmp_path):
    """The real plugin, copied where its RUNPATH ($ORIGIN/../../lib) finds none of Qt's
    libraries: the real ldd names them, and the fix reinstalls PySide6."""
    plugin = display.plugin_path("xcb")
    if plugin is None or shutil.which("ldd") is None:
        pytest.skip("no PySide6 xcb plugin or no ldd here")
    fake = tmp_path / "plugins" / "platforms" / plugin.name
    fake.parent.mkdir(parents=True)
    shutil.copy(plugin, fake)
    monkeypatch.setattr(display, "plugin_path", lambda platform="xcb": fake)
    check = doctor.check_window()
    assert check.status == doctor.MISSING
    assert "libQt6XcbQpa.so.6" in check.detail and "not found" in check.detail
    assert "PySide6" in check.fix


def test_window_loads_the_platform_plugin_for_real(monkeypatch):
    monkeypatch.setattr(display, "xcb_missing", lambda: [])
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    check = doctor.check_window()
    assert (check.status, check.detail) == (doctor.OK, "Qt's offscreen platform plugin loads")
    monkeypatch.setenv("QT_QPA_PLATFORM", "no-such-platform")
    check = doctor.check_window()
    assert check.status == doctor.MISSING and "no-such-platform" in check.detail
    assert "apt-get install" in check.fix or os.name == "nt"


def test_no_display_is_a_note_naming_the_headless_commands(monkeypatch):
    monkeypatch.setattr(display, "xcb_missing", lambda: [])
    monkeypatch.setattr(display.sys, "platform", "linux")
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    check = doctor.check_window()
    assert check.status == doctor.NOTE
    assert "no display" in check.detail and "hearth chat" in check.detail


def test_the_server_extra_is_listed_with_its_install_line(monkeypatch):
    assert doctor.check_server().status == doctor.OK  # the dev install has it
    _without(monkeypatch, "fastapi")
    check = doctor.check_server()
    assert check.status == doctor.NOTE and "fastapi not installed" in check.detail
    assert "-m pip install" in check.fix and "fastapi" in check.fix and "uvicorn" in check.fix
