"""Can the window open here: is there a display, and does Qt's X11 (xcb) platform plugin find
every system library it links? No Qt is imported (the engine never imports Qt): the plugin is
found through PySide6's package folder and its libraries are read with `ldd`; tools/doctor.py
loads it for real in a child process.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

# Every system library that Qt's xcb plugin and the Qt libraries under it link (their ELF
# NEEDED entries, libc and zlib aside), with the Debian/Ubuntu package that holds it. The
# README's apt line names exactly these packages (tests/test_packaging.py holds it to them).
XCB_LIBRARY_PACKAGES = {
    "libGL.so.1": "libgl1",
    "libEGL.so.1": "libegl1",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libX11.so.6": "libx11-6",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libxcb.so.1": "libxcb1",
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libglib-2.0.so.0": "libglib2.0-0",
    "libgthread-2.0.so.0": "libglib2.0-0",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libdbus-1.so.3": "libdbus-1-3",
}
QT_PACKAGES = tuple(dict.fromkeys(XCB_LIBRARY_PACKAGES.values()))  # the apt line, in order
NO_DISPLAY = ("there is no display to open the window on (DISPLAY and WAYLAND_DISPLAY are not "
              "set); without one, chat in this terminal with `hearth chat` or serve the "
              "OpenAI-compatible API with `hearth serve`")


def has_display(env: dict | None = None) -> bool:
    """False on Linux without an X11 or Wayland display and without a chosen Qt platform
    (QT_QPA_PLATFORM=offscreen, say): Qt would abort there with its own message."""
    if not sys.platform.startswith("linux"):
        return True  # Windows and macOS always have their own platform
    env = os.environ if env is None else env
    return any(env.get(name) for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"))


def plugin_path(platform: str = "xcb") -> Path | None:
    """PySide6's platform plugin file, None when PySide6 or the plugin is absent."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "Qt" / "plugins" / "platforms" / (
        f"libq{platform}.so")
    return path if path.is_file() else None


def ldd(path: Path) -> str | None:
    """`ldd PATH`'s output: every library the file needs, transitively; None without ldd."""
    try:
        proc = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout


def missing_libraries(plugin: Path) -> list[str] | None:
    """The libraries `plugin` needs that the loader cannot find ("not found" in ldd), in the
    order ldd names them; None where ldd cannot tell."""
    out = ldd(plugin)
    if out is None:
        return None
    missing = [line.split("=>")[0].strip() for line in out.splitlines()
               if line.strip().endswith("not found")]
    return list(dict.fromkeys(missing))


def apt_packages(libraries: list[str]) -> list[str] | None:
    """The Debian/Ubuntu packages that hold these libraries; None where one is not a system
    library of this table (a Qt library missing from PySide6 is pip's to fix)."""
    if not all(name in XCB_LIBRARY_PACKAGES for name in libraries):
        return None
    return list(dict.fromkeys(XCB_LIBRARY_PACKAGES[name] for name in libraries))


def fix_for(libraries: list[str]) -> str:
    """The command that installs missing libraries of the plugin."""
    packages = apt_packages(libraries)
    if packages is None:
        return ("reinstall PySide6 (pip install --force-reinstall PySide6-Essentials) and "
                f"install Qt's system libraries: sudo apt-get install -y {' '.join(QT_PACKAGES)}")
    return f"sudo apt-get install -y {' '.join(packages)}"


def xcb_missing() -> list[str]:
    """What keeps Qt's X11 plugin from loading: the libraries the loader cannot find, or the
    plugin itself where PySide6 lacks it; [] where nothing is missing, ldd cannot tell, or the
    system is not Linux."""
    if not sys.platform.startswith("linux"):
        return []
    plugin = plugin_path("xcb")
    if plugin is None:
        return ["libqxcb.so"]
    return missing_libraries(plugin) or []


def window_failure(signal_number: int) -> str:
    """Why a window process that a signal ended (Qt aborts when it cannot load its platform
    plugin) did not open: the libraries missing, with their fix, where ldd names them."""
    missing = xcb_missing()
    if missing:
        return (f"the window could not open: Qt's X11 platform plugin needs "
                f"{', '.join(missing)}, which are not installed; to fix: {fix_for(missing)}")
    return (f"the window ended with signal {signal_number}; `hearth doctor` checks what it "
            "needs")


# Qt aborts where it cannot load its platform plugin, so it is tried in a child process
PLATFORM_PROBE = ("from PySide6.QtGui import QGuiApplication; "
                  "app = QGuiApplication(['hearth-doctor']); print(app.platformName())")


def probe_platform() -> tuple[bool, str]:
    """Load Qt's platform plugin for real, as the window would: (True, its name) or (False, why:
    Qt's first line)."""
    try:
        proc = subprocess.run([sys.executable, "-c", PLATFORM_PROBE], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"it could not be tried: {e}"
    if proc.returncode != 0 or not proc.stdout.strip():
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return False, lines[0] if lines else f"exit status {proc.returncode}"
    return True, proc.stdout.strip()
