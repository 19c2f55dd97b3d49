"""The window appears within 2 seconds of launch. Timed from outside, as a user
waits: `python -m app --startup-check` in a fresh process, until it says the window painted.
The assertion has a generous margin (CI machines are slow and shared); docs/benchmark-log.md has the
measured figure."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from app.paths import REPO_ROOT

LIMIT_S = 10.0  # the goal is 2 s; this only catches a start-up that has gone badly wrong


def test_the_window_appears_within_seconds_of_launch(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HEARTH_DATA_DIR": str(tmp_path / "d"),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}  # QSettings: not the user's
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "app", "--startup-check"], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    wall_s = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr
    match = re.search(r"window shown after ([\d.]+) s", done.stdout)
    assert match, done.stdout + done.stderr
    shown_s = float(match.group(1))
    assert 0 < shown_s < wall_s < LIMIT_S
    assert "window shown" in (tmp_path / "d" / "hearth.log").read_text()
