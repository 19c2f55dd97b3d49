"""The tree reads as the architecture: docs/architecture.md is drawn from the code as it is, no
folder of engine/ or app/ holds more than about 12 modules, and no module more than about 300
lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_MODULES = 12  # per folder, __init__.py not counted
MAX_LINES = 330  # "about 300": a cut below this would split one idea in two


def test_the_drawing_is_current():
    proc = subprocess.run([sys.executable, "packaging/architecture.py", "--check"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _folders():
    for top in ("engine", "app"):
        for folder in [REPO / top, *(p for p in (REPO / top).rglob("*") if p.is_dir())]:
            if folder.name != "__pycache__":
                yield folder


def test_no_folder_holds_more_than_about_twelve_modules():
    crowded = {str(f.relative_to(REPO)): n for f in _folders()
               if (n := len([p for p in f.glob("*.py") if p.name != "__init__.py"])) > MAX_MODULES}
    assert not crowded, crowded


def test_no_module_is_longer_than_about_three_hundred_lines():
    long = {str(p.relative_to(REPO)): n for f in _folders() for p in f.glob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long
