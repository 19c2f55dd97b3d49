"""HEARTH_DEBUG turns tracebacks on only when it says so: "0", "false" or
"" keep the one-line error that users get."""

from __future__ import annotations

import pytest

from engine.cli import cli
from engine.tools import plan_report


def _fail(*_args, **_kwargs):
    raise RuntimeError("an unexpected failure")


@pytest.mark.parametrize("value", ["0", "", "false", "no", "off", "False"])
def test_off_values_keep_the_one_line_error(monkeypatch, capsys, value):
    monkeypatch.setenv("HEARTH_DEBUG", value)
    monkeypatch.setattr(plan_report, "run_gpu", _fail)
    assert cli.main(["gpu"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "hearth: error: RuntimeError: an unexpected failure (set HEARTH_DEBUG=1 for details)"]


@pytest.mark.parametrize("value", ["1", "true", "yes", "TRUE", " 1 "])
def test_on_values_raise_the_traceback(monkeypatch, value):
    monkeypatch.setenv("HEARTH_DEBUG", value)
    monkeypatch.setattr(plan_report, "run_gpu", _fail)
    with pytest.raises(RuntimeError, match="an unexpected failure"):
        cli.main(["gpu"])
