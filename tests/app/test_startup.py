"""The window appears and says how long it took: `python -m app --startup-check` in a fresh
process, until it says the window painted. How soon is a benchmark (docs/benchmark-log.md),
never a timed assertion here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from app.paths import REPO_ROOT


def test_the_window_appears_and_says_when(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HEARTH_DATA_DIR": str(tmp_path / "d"),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}  # QSettings: not the user's
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "app", "--startup-check"], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    wall_s = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr
    match = re.search(r"window shown after ([\d.]+) s", done.stdout)
    assert match, done.stdout + done.stderr
    shown_s = float(match.group(1))
    assert 0 < shown_s < wall_s
    assert "window shown" in (tmp_path / "d" / "hearth.log").read_text()


def test_without_a_display_the_app_says_so_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env.update(HEARTH_DATA_DIR=str(tmp_path / "d"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    done = subprocess.run([sys.executable, "-m", "app"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hearth: there is no display"), done.stderr
    assert "`hearth chat`" in lines[0]
