"""The seam and the code style, checked as tests so the README's one command runs them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    found = Path(sys.executable).with_name(name)
    return str(found) if found.exists() else shutil.which(name) or name


def test_import_linter_contracts_hold():
    proc = subprocess.run([_tool("lint-imports")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 kept, 0 broken" in proc.stdout


def test_ruff_clean():
    proc = subprocess.run([_tool("ruff"), "check", "engine", "app", "tests"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_readme_test_command_is_what_ci_runs():
    readme = (REPO / "README.md").read_text().splitlines()
    i = next(n for n, line in enumerate(readme) if line.startswith("<!-- test-command"))
    assert "pytest" in readme[i + 1]
    assert "<!-- test-command" in (REPO / ".ci" / "run").read_text()
