"""Third-party notes stay off the terminal unless HEARTH_DEBUG=1: an engine process that imports
torchao (as gptqmodel does) prints none of its or torch's pytree notes; with HEARTH_DEBUG=1, what
a plain `import torchao` prints. (`hearth run` not importing torchao: test_thread_policy.py.)"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from tests.engine.helpers import REPO

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                reason="torchao comes with the awq extra (gptqmodel)")


def lines(text: str) -> list[str]:
    """Log lines without their time and process id (torch's `W1201 20:12:03.99 2864 ...`)."""
    return [re.sub(r"^([WIE]\d{4}) [\d:.]+ +\d+ ", r"\1 ", line) for line in text.splitlines()]


def stderr_of(code: str, **env: str) -> str:
    full = {k: v for k, v in os.environ.items() if k != "HEARTH_DEBUG"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                          env={**full, "PYTHONPATH": str(REPO), **env}, capture_output=True,
                          text=True, timeout=120, check=True)
    return proc.stderr


def test_torchao_notes_show_only_with_hearth_debug():
    plain = stderr_of("import torch, torchao")
    assert stderr_of("import engine, torch, torchao") == ""
    assert lines(stderr_of("import engine, torch, torchao", HEARTH_DEBUG="1")) == lines(plain)
