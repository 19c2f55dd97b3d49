"""`hearth doctor`: is everything Hearth needs installed, and how to fix what is not.

One `Check` per part, printed as one line in plain words. Nothing heavy is imported with this
module (the CLI validates before torch): torch is imported inside its own check, the driver is read
through NVML (no CUDA context), and Qt is tried in a child process, since the engine never imports
Qt (import-linter contract). Versions and pip commands come from pip_packages.py.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.platform import display
from engine.platform.gpu import detect_gpus
from engine.tools.pip_packages import (
    canonical,
    extra_install,
    installed_version,
    older,
    pip_install,
    required_specs,
    satisfies,
    torch_index_url,
)

OK, NOTE, MISSING = "ok", "note", "MISSING"
REPO_DIR = Path(__file__).resolve().parents[2]  # engine/tools/doctor.py -> the checkout
QT_LIBRARIES = " ".join(display.QT_PACKAGES)
DRIVER_URL = "https://www.nvidia.com/drivers"

# Required packages checked by name and version alone (torch and Qt have their own checks).
PACKAGES = (
    ("transformers", "model definitions and checkpoint loading"),
    ("accelerate", "loading large checkpoints"),
    ("safetensors", "reading weights"),
    ("tokenizers", "tokenizing"),
    ("bitsandbytes", "INT8 and 4-bit NF4 weights"),
    ("huggingface-hub", "the Hugging Face cache and model downloads"),
    ("nvidia-ml-py", "reading the GPU through the driver"),
    ("pyqtgraph", "the desktop app's live charts"),
    ("numpy", "arrays"),
)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK, NOTE (not needed, or only for an optional feature) or MISSING (needed)
    detail: str
    fix: str = ""  # a whole sentence: the command or step that fixes or adds it

    def line(self) -> str:
        text = f"{self.status:<8}{self.name}: {self.detail}"
        return f"{text}. {self.fix}" if self.fix else text


def driver_cuda_version() -> tuple[int, int] | None:
    """The highest CUDA version the driver supports, through NVML; None without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = int(pynvml.nvmlSystemGetCudaDriverVersion())  # e.g. 12040 for 12.4
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None
    return v // 1000, v % 1000 // 10


# --- the checks, in the order they print ---------------------------------------------------


def check_hearth() -> Check:
    version = installed_version("hearth") or "not installed, running from a checkout"
    try:
        from hearth_resources import folder

        resources = folder()
    except ImportError:
        resources = None
    if resources is None or not (resources / "demo_model" / "config.json").is_file():
        return Check("Hearth", MISSING, f"{version}; its package data (demo model, icons) is "
                                        f"missing beside the engine in {REPO_DIR}",
                     "Fix: reinstall Hearth: " + pip_install("--force-reinstall",
                                                              "PATH/TO/hearth"))
    return Check("Hearth", OK, f"{version} ({REPO_DIR})")


def check_python() -> Check:
    v = sys.version_info
    where = f"{v.major}.{v.minor}.{v.micro} ({sys.executable})"
    if v >= (3, 11):
        return Check("Python", OK, where)
    return Check("Python", MISSING, f"{where} is older than 3.11",
                 "Fix: install Python 3.11 or newer and run packaging/install.sh again.")


def check_driver(report, cuda: tuple[int, int] | None) -> Check:
    if report.cpu_mode:
        why = (report.reason or "no NVIDIA GPU found").removesuffix("; CPU mode")
        return Check("NVIDIA driver", NOTE, f"{why}; Hearth runs on the CPU (small models only)",
                     f"To use an NVIDIA GPU, install its driver ({DRIVER_URL}; on Ubuntu: "
                     "sudo ubuntu-drivers install) and restart.")
    g = report.gpus[0]
    cuda_text = f", CUDA {cuda[0]}.{cuda[1]}" if cuda else ""
    more = f" and {len(report.gpus) - 1} more" if len(report.gpus) > 1 else ""
    return Check("NVIDIA driver", OK,
                 f"{g.driver_version or 'version unknown'}{cuda_text}; GPU {g.index}: {g.name} "
                 f"({g.total_bytes / 2**30:.0f} GiB){more}")


def check_torch(report, cuda: tuple[int, int] | None, specs: dict[str, str]) -> Check:
    index = torch_index_url(cuda if not report.cpu_mode else None)
    if importlib.util.find_spec("torch") is None:
        return Check("torch", MISSING, "not installed (it runs the models)",
                     "Fix: " + pip_install("torch", extra=f"--index-url {index}"))
    try:
        import torch
    except Exception as e:  # a broken wheel or a missing system library
        return Check("torch", MISSING, f"installed but does not import ({type(e).__name__}: {e})",
                     "Fix: " + pip_install("--force-reinstall", "torch",
                                           extra=f"--index-url {index}"))
    version, built_for = torch.__version__, torch.version.cuda
    spec = specs.get("torch", "")
    if not satisfies(version, spec):
        return Check("torch", MISSING, f"{version} is installed but Hearth needs torch{spec}",
                     "Fix: " + pip_install("--upgrade", "torch", extra=f"--index-url {index}"))
    if built_for is None:
        if report.cpu_mode:
            return Check("torch", OK, f"{version}, a CPU build (right without an NVIDIA GPU)")
        return Check("torch", MISSING,
                     f"{version} is a CPU build but this machine has an NVIDIA GPU, which it "
                     "cannot use",
                     "Fix: " + pip_install("--force-reinstall", "torch",
                                           extra=f"--index-url {index}"))
    major = int(built_for.split(".")[0])
    if cuda is not None and cuda[0] < major:
        return Check("torch", MISSING,
                     f"{version} is built for CUDA {built_for} but the driver supports CUDA "
                     f"{cuda[0]}.{cuda[1]} at most",
                     f"Fix: update the NVIDIA driver ({DRIVER_URL}), or install the build for "
                     f"this driver: {pip_install('--force-reinstall', 'torch')} "
                     f"--index-url {index}")
    where = "" if not report.cpu_mode else "; no GPU found, so it runs on the CPU"
    return Check("torch", OK, f"{version}, built for CUDA {built_for}{where}")


def check_package(dist: str, purpose: str, specs: dict[str, str]) -> Check:
    spec = specs.get(canonical(dist), "")
    version = installed_version(dist)
    if version is None:
        return Check(dist, MISSING, f"not installed ({purpose} needs it)",
                     "Fix: " + pip_install(f"{dist}{spec}"))
    if not satisfies(version, spec):
        return Check(dist, MISSING, f"{version} is installed but Hearth needs {dist}{spec}",
                     "Fix: " + pip_install(f"{dist}{spec}"))
    return Check(dist, OK, version)


def check_gptqmodel() -> Check:
    version = installed_version("gptqmodel")
    if version is not None:
        return Check("gptqmodel", OK, f"{version} (AWQ models in plain transformers)")
    torch_version = installed_version("torch") or ""
    # 7.7 needs torch >= 2.14.1: with an older torch, pip would replace it (maybe with a CUDA build)
    pin = "gptqmodel==7.6.0" if older(torch_version.split("+")[0], "2.14.1") else "gptqmodel"
    return Check("gptqmodel", NOTE, "not installed; optional: Hearth runs AWQ models without "
                 "it, plain transformers needs it for them",
                 "To add it: " + pip_install(pin))


def check_triton(torch_has_cuda: bool) -> Check:
    version = installed_version("triton") or installed_version("triton-windows")
    if version is not None and importlib.util.find_spec("triton") is not None:
        return Check("Triton", OK, version)
    if not torch_has_cuda:
        return Check("Triton", NOTE, "not installed; not needed with a CPU build of torch, "
                                     "which ships none")
    name = "triton-windows" if os.name == "nt" else "triton"
    return Check("Triton", NOTE, "not installed; fused GPU kernels fall back to plain PyTorch "
                                 "(slower) and --compile cannot work",
                 "To add it: " + pip_install(name))


def check_nvrtc(torch_has_cuda: bool) -> Check:
    """NVRTC compiles Hearth's int4 kernel for AWQ weights at load (kernels/int4_mma_kernel.py);
    torch's CUDA builds bring it (the nvidia-cuda-nvrtc wheel)."""
    if not torch_has_cuda:
        return Check("NVRTC", NOTE, "not needed with a CPU build of torch")
    try:
        from torch.cuda._utils import _get_gpu_rtc_library

        _get_gpu_rtc_library()
    except (ImportError, OSError) as e:
        return Check("NVRTC", NOTE, f"not found ({e}); AWQ weights fall back to torch's tinygemm "
                                    "kernel, half the speed with many chats at once",
                     "To add it: reinstall torch's CUDA build, which brings NVRTC.")
    return Check("NVRTC", OK, "found (Hearth's int4 kernel for AWQ weights compiles with it)")


def find_c_compiler() -> str | None:
    names = [shlex.split(os.environ["CC"])[0]] if os.environ.get("CC") else []
    names += ["cl"] if os.name == "nt" else ["cc", "gcc", "clang"]
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def check_c_compiler(has_triton: bool) -> Check:
    found = find_c_compiler()
    if found:
        return Check("C compiler", OK, f"{found} (Triton builds its kernels with it)")
    if os.name == "nt":
        fix = "To add one: install Visual Studio Build Tools with the C++ workload."
    else:
        fix = "To add one: sudo apt-get install -y gcc (or your distribution's gcc package)."
    if has_triton:
        return Check("C compiler", NOTE, "none found; Triton needs one to build kernels, so "
                                         "--compile and Triton kernels fail", fix)
    return Check("C compiler", NOTE, "none found; only Triton needs one", fix)


def check_qt(specs: dict[str, str]) -> Check:
    dist = "PySide6-Essentials"
    spec = specs.get(canonical(dist), "")
    if importlib.util.find_spec("PySide6") is None:
        return Check("Qt", MISSING, "PySide6 is not installed (the desktop app needs it; the "
                                    "command line works without it)",
                     "Fix: " + pip_install(f"{dist}{spec}"))
    # a child process: the engine never imports Qt, and a missing system library shows up here
    probe = "import PySide6, PySide6.QtWidgets; print(PySide6.__version__)"
    try:
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Check("Qt", MISSING, f"PySide6 could not be tried ({e})")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        if ".so" in last and os.name != "nt":
            fix = f"Fix: sudo apt-get install -y {QT_LIBRARIES}"
        else:
            fix = "Fix: " + pip_install("--force-reinstall", f"{dist}{spec}")
        return Check("Qt", MISSING, f"PySide6 does not import ({last})", fix)
    version = proc.stdout.strip()
    installed = installed_version(dist)
    if installed and not satisfies(installed, spec):
        return Check("Qt", MISSING, f"{dist} {installed} is installed but Hearth needs "
                                    f"{dist}{spec}", "Fix: " + pip_install(f"{dist}{spec}"))
    return Check("Qt", OK, f"PySide6 {version} (the desktop app)")


def check_window() -> Check:
    """Does the window open here: the X11 plugin's libraries (ldd), then, with a display, Qt
    loading its platform plugin in a child process."""
    if importlib.util.find_spec("PySide6") is None:
        return Check("Window", NOTE, "cannot open without PySide6 (the Qt line above)")
    missing = display.xcb_missing()
    if missing:
        return Check("Window", MISSING, f"Qt's X11 platform plugin cannot load: "
                                        f"{', '.join(missing)} not found",
                     f"Fix: {display.fix_for(missing)}")
    if not display.has_display():
        return Check("Window", NOTE, "no display here (DISPLAY and WAYLAND_DISPLAY are not "
                                     "set), so the window cannot open; hearth chat and hearth "
                                     "serve work without one")
    loaded, text = display.probe_platform()
    if not loaded:
        fix = f"Fix: sudo apt-get install -y {QT_LIBRARIES}" if os.name != "nt" else ""
        return Check("Window", MISSING, f"Qt cannot load its platform plugin ({text})", fix)
    return Check("Window", OK, f"Qt's {text} platform plugin loads")


SERVER_PACKAGES = ("fastapi", "uvicorn")  # what `hearth serve` imports first


def check_server() -> Check:
    """The optional `server` extra: `hearth serve` and the window's Server panel."""
    missing = [dist for dist in SERVER_PACKAGES if installed_version(dist) is None]
    if missing:
        return Check("server extra", NOTE, f"{', '.join(missing)} not installed; optional: "
                                           "hearth serve and the window's Server panel need it",
                     f"To add it: {extra_install('server')}")
    versions = ", ".join(f"{dist} {installed_version(dist)}" for dist in SERVER_PACKAGES)
    return Check("server extra", OK, f"{versions} (hearth serve)")


def run_checks() -> list[Check]:
    specs = required_specs()
    report = detect_gpus()
    cuda = None if report.cpu_mode else driver_cuda_version()
    checks = [check_hearth(), check_python(), check_driver(report, cuda),
              check_torch(report, cuda, specs)]
    torch_has_cuda = False
    if checks[-1].status == OK:
        import torch

        torch_has_cuda = torch.version.cuda is not None
    checks += [check_package(dist, purpose, specs) for dist, purpose in PACKAGES]
    checks.append(check_gptqmodel())
    checks.append(check_nvrtc(torch_has_cuda))
    checks.append(check_triton(torch_has_cuda))
    checks.append(check_c_compiler(has_triton=checks[-1].status == OK))
    checks.append(check_qt(specs))
    checks.append(check_window())
    checks.append(check_server())
    return checks


def main() -> int:
    checks = run_checks()
    for check in checks:
        print(check.line())
    missing = [c.name for c in checks if c.status == MISSING]
    if missing:
        print(f"\n{len(missing)} needed part(s) missing or broken: {', '.join(missing)}. "
              "Run the command after 'Fix:' on each MISSING line, then hearth doctor again.")
        return 1
    print("\nEverything Hearth needs is here.")
    return 0
