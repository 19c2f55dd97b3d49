"""Python packages as pip sees them, for `hearth doctor`: installed versions read from metadata
(nothing imported), what the installed Hearth requires, and the exact pip command and PyTorch
wheel index that install one into this interpreter's environment."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from importlib import metadata


def installed_version(dist: str) -> str | None:
    """The installed version of a distribution, None when it is absent. Read from metadata, so
    nothing is imported (tests replace doctor's name for it to simulate a missing package)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def required_specs() -> dict[str, str]:
    """What the installed Hearth requires: canonical name -> version specifier ('' for any)."""
    try:
        requires = metadata.requires("hearth") or []
    except metadata.PackageNotFoundError:
        return {}  # running from a bare checkout: names are still checked, versions are not
    specs = {}
    for req in requires:
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)(;.*)?", req)
        if m and not (m[3] and "extra" in m[3]):
            specs[canonical(m[1])] = m[2].strip()
    return specs


def extra_install(extra: str) -> str:
    """The pip command that adds one of Hearth's extras ('server': FastAPI, uvicorn...) to this
    environment: its requirements as the installed Hearth lists them."""
    try:
        requires = metadata.requires("hearth") or []
    except metadata.PackageNotFoundError:
        requires = []
    wanted = re.compile(rf"extra\s*==\s*['\"]{re.escape(extra)}['\"]")
    reqs = [req.split(";")[0].strip() for req in requires if wanted.search(req.partition(";")[2])]
    if reqs:
        return pip_install(*reqs)
    return pip_install(f".[{extra}]") + " (from the root of Hearth's clone)"


def satisfies(version: str, spec: str) -> bool:
    if not spec:
        return True
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:
        return True  # cannot tell without `packaging`; the import checks still stand
    return SpecifierSet(spec).contains(version, prereleases=True)


def older(version: str, than: str) -> bool:
    try:
        from packaging.version import Version

        return Version(version) < Version(than)
    except Exception:
        return False


def pip_install(*requirements: str, extra: str = "") -> str:
    """The exact command that installs into this interpreter's environment."""
    argv = [sys.executable, "-m", "pip", "install", *requirements]
    cmd = subprocess.list2cmdline(argv) if os.name == "nt" else shlex.join(argv)
    return cmd + (f" {extra}" if extra else "")


def torch_index_url(driver_cuda: tuple[int, int] | None) -> str:
    """The PyTorch wheel index for a driver (its highest CUDA version). packaging/install.sh and
    install.ps1 make the same choice; tests/test_packaging.py holds them to it."""
    if driver_cuda is None or driver_cuda < (12, 0):
        tag = "cpu"  # no driver, or one older than any CUDA build PyTorch still makes
    elif driver_cuda >= (13, 0):
        tag = "cu130"
    elif driver_cuda >= (12, 8):
        tag = "cu128"
    else:
        tag = "cu126"  # CUDA minor-version compatibility: runs on any 12.x driver
    return f"https://download.pytorch.org/whl/{tag}"
