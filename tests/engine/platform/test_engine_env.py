"""What importing the engine sets in the environment: the CUDA allocator's expandable segments
(the setting the VRAM planner was validated with), unless the user chose allocator settings."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.engine.helpers import REPO

SHOW = "import engine, os; print(os.environ.get('PYTORCH_CUDA_ALLOC_CONF'))"


def _child(**env: str) -> str:
    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    proc = subprocess.run([sys.executable, "-c", SHOW], cwd=REPO, env={**base, **env},
                          capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout.strip()


def test_the_engine_asks_for_expandable_segments():
    assert _child() == "expandable_segments:True"


def test_the_users_allocator_settings_win():
    assert _child(PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:128") == "max_split_size_mb:128"
    assert _child(PYTORCH_ALLOC_CONF="expandable_segments:False") == "None"
