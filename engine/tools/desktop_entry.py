"""`hearth install-desktop`: the freedesktop menu entry and icon for this user (Linux).

Fills hearth_resources/hearth.desktop with the command of this installation and copies the icon into
the user's hicolor theme. It writes under $XDG_DATA_HOME only: no root, no system folders.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from engine.events import BadRequest
from hearth_resources import folder as resources_folder

RESOURCES_DIR = resources_folder()  # package data: in a clone and in an installed wheel
TEMPLATE = RESOURCES_DIR / "hearth.desktop"
ICON = RESOURCES_DIR / "icons" / "hearth.svg"
APP_ID = "hearth"  # the entry's file name and its Icon= theme name

# characters that force an Exec argument into double quotes (Desktop Entry spec, "The Exec key")
_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")


def data_home() -> Path:
    """$XDG_DATA_HOME, or ~/.local/share when it is unset or relative (the spec says to ignore
    a relative one)."""
    value = os.environ.get("XDG_DATA_HOME", "")
    return Path(value) if os.path.isabs(value) else Path.home() / ".local" / "share"


def hearth_command() -> list[str]:
    """How a menu launch reaches this installation: the `hearth` console script beside this
    interpreter (a venv's bin/), else this interpreter running the CLI module."""
    # sys.executable is not resolved: a venv's python is a symlink out of the venv
    script = Path(sys.executable).with_name("hearth.exe" if os.name == "nt" else "hearth")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "engine.cli.cli"]


def _string(value: str) -> str:
    """A desktop-entry string value: backslash, newline, tab and CR escaped."""
    return (value.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
            .replace("\r", "\\r"))


def exec_arg(arg: str) -> str:
    """One Exec argument, quoted as the spec asks. Two escape levels apply: inside double quotes
    `"`, backtick, `$` and backslash take a backslash; then the whole value is a string, whose
    own escaping doubles every backslash again. `%` is a field code unless doubled."""
    arg = arg.replace("%", "%%")
    if any(c in _RESERVED for c in arg):
        arg = '"' + "".join("\\" + c if c in '"`$\\' else c for c in arg) + '"'
    return _string(arg)


def render(command: list[str]) -> str:
    """The template with Exec= and TryExec= pointing at `command`."""
    lines = []
    for line in TEMPLATE.read_text(encoding="utf-8").splitlines():
        if line.startswith("Exec="):
            line = "Exec=" + " ".join(exec_arg(a) for a in [*command, "gui"])
        elif line.startswith("TryExec="):
            line = "TryExec=" + _string(command[0])  # the menu hides the entry once it is gone
        lines.append(line)
    return "\n".join(lines) + "\n"


def install(root: Path | None = None, command: list[str] | None = None) -> tuple[Path, Path]:
    """Write the entry and the icon under `root` (default: data_home()); returns their paths."""
    root = data_home() if root is None else root
    entry = root / "applications" / f"{APP_ID}.desktop"
    icon = root / "icons" / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg"
    entry.parent.mkdir(parents=True, exist_ok=True)
    icon.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ICON, icon)
    # written aside and renamed: a menu watching the folder never reads half a file
    staging = entry.with_name(f".{entry.name}.tmp")
    staging.write_text(render(command or hearth_command()), encoding="utf-8")
    staging.chmod(0o644)
    os.replace(staging, entry)
    return entry, icon


def main() -> int:
    if not sys.platform.startswith(("linux", "freebsd", "openbsd", "netbsd")):
        raise BadRequest("install-desktop writes a freedesktop menu entry (Linux); on Windows "
                         "packaging/install.ps1 adds a Start-menu shortcut instead")
    for path in (TEMPLATE, ICON):
        if not path.is_file():
            raise BadRequest(f"{path} is missing from this installation: reinstall Hearth "
                             "(pip install --force-reinstall PATH/TO/hearth)")
    command = hearth_command()
    entry, icon = install(command=command)
    print(f"installed {entry} (starts {' '.join(command)} gui)")
    print(f"installed {icon}")
    print("Hearth now appears in the application menu; remove these two files to take it out.")
    return 0
