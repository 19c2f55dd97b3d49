"""torch's CUDA allocator settings in the engine's processes: expandable segments (the setting
the VRAM planner was validated with), unless the user chose allocator settings; in the
environment of every process the engine starts (child_env), and in a process that loads a model
(platform/allocator.py, before CUDA starts), never as a side effect of `import engine`."""

from __future__ import annotations

import os
import subprocess
import sys

from engine.platform import child_env
from tests.engine.helpers import REPO

SHOW = ("import engine, os; before = os.environ.get('PYTORCH_CUDA_ALLOC_CONF'); "
        "from engine.platform import allocator; allocator.configure(); "
        "print(before, os.environ.get('PYTORCH_CUDA_ALLOC_CONF'))")
NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def _child(**env: str) -> tuple[str, str]:
    """(the setting after `import engine`, after a load's allocator.configure())."""
    base = {k: v for k, v in os.environ.items() if k not in NAMES}
    proc = subprocess.run([sys.executable, "-c", SHOW], cwd=REPO, env={**base, **env},
                          capture_output=True, text=True, timeout=60, check=True)
    before, after = proc.stdout.split()
    return before, after


def test_the_engine_asks_for_expandable_segments():
    before, after = _child()
    assert before == "None"  # importing the engine sets nothing
    assert after == "expandable_segments:True"


def test_the_users_allocator_settings_win():
    assert _child(PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:128")[1] == "max_split_size_mb:128"
    assert _child(PYTORCH_ALLOC_CONF="expandable_segments:False")[1] == "None"


def test_every_child_process_gets_them(monkeypatch):
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    assert child_env.child_env()["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:False")
    env = child_env.child_env()
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
    assert env["PYTORCH_ALLOC_CONF"] == "expandable_segments:False"
