"""The window starts styled and with its icon, from the package data (`--startup-check` says
so; CI runs the same check on the installed wheel)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from app.paths import REPO_ROOT, RESOURCES_DIR


def test_the_window_starts_with_its_style_sheet_and_icon(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HEARTH_DATA_DIR": str(tmp_path / "d"),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    done = subprocess.run([sys.executable, "-m", "app", "--startup-check"], cwd=tmp_path,
                          env={**env, "PYTHONPATH": str(REPO_ROOT)}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # the sheet in use may be a theme made from hearth.qss (app/widgets/theme.py): loaded, not empty
    match = re.search(r"^style sheet: loaded, (\d+) characters$", done.stdout, re.M)
    assert match and int(match.group(1)) > 0, done.stdout
    assert f"icon: loaded ({RESOURCES_DIR / 'icons' / 'hearth.svg'})" in done.stdout
