"""What a first run on a bare machine meets, each in one sentence: no display for the window,
Qt's X11 libraries missing under a display, `hearth serve` without its extra, an empty
prompt."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.cli import cli
from engine.platform import display
from tests.engine.cli.test_bad_input import one_error_line
from tests.engine.helpers import REPO
from tests.test_doctor import LDD_TWO_MISSING


def _no_window_process(*args, **kwargs):
    raise AssertionError("the window's process was started")


@pytest.mark.parametrize("argv", [[], ["gui"]])
def test_no_display_is_one_line_naming_the_headless_commands(argv, monkeypatch, capsys):
    monkeypatch.setattr(display.sys, "platform", "linux")
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cli.subprocess, "call", _no_window_process)
    assert cli.main(argv) == 2
    line = one_error_line(capsys)
    assert line.startswith("hearth: there is no display")
    assert "`hearth chat`" in line and "`hearth serve`" in line


def test_a_window_that_qt_aborts_names_the_missing_libraries(monkeypatch, capsys):
    """Under a display, Qt aborts (SIGABRT) where its X11 plugin cannot load."""
    monkeypatch.setenv("DISPLAY", ":99")
    monkeypatch.setattr(cli.subprocess, "call", lambda *a, **kw: -6)
    monkeypatch.setattr(display, "ldd", lambda path: LDD_TWO_MISSING)
    monkeypatch.setattr(display.sys, "platform", "linux")
    if display.plugin_path("xcb") is None:
        pytest.skip("no PySide6 xcb plugin here")
    assert cli.main([]) == 1
    line = one_error_line(capsys)
    assert "libxcb-icccm.so.4, libxcb-keysyms.so.1" in line
    assert line.endswith("sudo apt-get install -y libxcb-icccm4 libxcb-keysyms1")


def test_serve_without_the_server_extra_is_one_line_with_the_install_command():
    code = ("import sys; sys.modules['fastapi'] = None; from engine.cli.cli import main; "
            "sys.exit(main(['serve']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "server extra is not installed (fastapi is missing)" in lines[0]
    assert "-m pip install" in lines[0] and "'fastapi" in lines[0] and "'uvicorn" in lines[0]


@pytest.mark.parametrize("prompt", ["", "  \n"])
def test_an_empty_prompt_is_bad_input(prompt, tiny_model, capsys):
    assert cli.main(["run", "--model", str(tiny_model), "--prompt", prompt]) == 2
    assert "--prompt is empty" in one_error_line(capsys)
