"""`hearth plan` over several cards: --tensor-parallel N (bytes per GPU) and the split shown
beside a one-card plan when one card is too small or the machine has several GPUs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.cli import cli
from engine.formats.model_shape import ModelShape
from engine.plan.memory import GiB
from engine.plan.multi_gpu import NCCL_BUFFERS_BYTES, plan_multi
from engine.platform.gpu import GpuInfo, GpuReport
from engine.tools import plan_multi_report, plan_report
from tests.test_plan import QWEN7B
from tests.test_plan_multi import QWEN14B

REPO = plan_report.__file__.rsplit("/engine/", 1)[0]


@pytest.fixture
def folders(tmp_path):
    out = {}
    for name, cfg in (("7b", QWEN7B), ("14b", QWEN14B)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        out[name] = str(tmp_path / name)
    return out


def machine(monkeypatch, n: int, gib: float = 24) -> None:
    size = int(gib * GiB)
    report = GpuReport(tuple(GpuInfo(i, "Fake", f"GPU-{i}", size, size - i * GiB, i * GiB, (9, 0),
                                     "560", True, True) for i in range(n)))
    monkeypatch.setattr(plan_multi_report, "detect_gpus", lambda: report)
    monkeypatch.setattr(plan_report, "detect_gpus", lambda: report)


def test_a_card_too_small_shows_the_split(folders, capsys):
    assert plan_report.run_plan(folders["14b"], vram_gib=24, context=8192) == 0  # nf4 fits
    out = capsys.readouterr().out
    split = [line for line in out.splitlines() if line.startswith("Split")]
    assert split == ["Split     needs 2 GPUs: tensor parallel 2, 17.7 GiB per GPU (bf16 weights, "
                     "bf16 KV cache, 8,192 tokens); cards of 24.00 GiB, as planned"]
    assert "`hearth run --tensor-parallel 2`" in out


def test_the_split_in_json(folders, capsys):
    assert plan_report.run_plan(folders["14b"], vram_gib=24, context=8192, as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["quant"] == "nf4" and out["fits"] is True  # the one-card plan, as before
    s = out["split"]
    assert (s["num_devices"], s["quant"], s["kv_dtype"], s["fits"]) == (2, "bf16", "bf16", True)
    want = plan_multi(ModelShape.from_config(QWEN14B), 2, "bf16", "bf16", 8192, 24 * GiB)
    assert s["plan"]["total_bytes_per_device"] == want.total_bytes_per_device
    assert s["summary"].startswith("needs 2 GPUs: tensor parallel 2")
    assert plan_report.run_plan(folders["7b"], vram_gib=24, as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["split"] is None  # one card holds bf16


def test_tensor_parallel_plans_per_gpu(folders, capsys):
    assert plan_report.run_plan(folders["14b"], vram_gib=24, context=8192, as_json=True,
                                tensor_parallel=2) == 0
    out = json.loads(capsys.readouterr().out)
    want = plan_multi(ModelShape.from_config(QWEN14B), 2, "bf16", "bf16", 8192, 24 * GiB)
    for key in ("weights_bytes", "kv_bytes_per_token", "kv_bytes", "total_bytes"):
        assert isinstance(out[key], int)
    assert out["tensor_parallel"] == 2 and out["fits"] is True
    assert out["total_bytes"] == want.total_bytes_per_device < 24 * GiB
    assert out["total_bytes_all_devices"] == 2 * out["total_bytes"]
    assert out["weights_bytes"] == want.weights_bytes_per_device
    assert out["allreduce_bytes"] == NCCL_BUFFERS_BYTES
    assert out["recommended"]["num_devices"] == 2
    assert plan_report.run_plan(folders["14b"], vram_gib=24, context=8192,
                                tensor_parallel=2) == 0
    text = capsys.readouterr().out
    assert "NCCL buffers" in text and "tensor parallel 2" in text and "fits" in text


def test_tensor_parallel_that_does_not_fit_exits_2(folders, capsys):
    assert plan_report.run_plan(folders["14b"], vram_gib=12, context=8192, as_json=True,
                                tensor_parallel=2) == 2
    cap = capsys.readouterr()
    assert json.loads(cap.out)["fits"] is False
    assert len(cap.err.strip().splitlines()) == 1 and "does not fit 2 cards" in cap.err


@pytest.mark.parametrize("args, words", [
    (["--tensor-parallel", "3"], "whole KV heads (4) and equal MLP slices (18944); "
                                 "--tensor-parallel takes 2, 4"),
    (["--tensor-parallel", "0"], "--tensor-parallel takes a whole number of GPUs"),
    (["--tensor-parallel", "2", "--quant", "nf4"], "16-bit weights only"),
    (["--tensor-parallel", "2", "--kv-dtype", "fp8"], "16-bit KV cache"),
])
def test_bad_tensor_parallel(args, words, folders, capsys):
    assert cli.main(["plan", "--model", folders["7b"], "--vram", "24", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and words in err, err


def test_this_machines_gpus(folders, capsys, monkeypatch):
    machine(monkeypatch, 2)
    assert plan_report.run_plan(folders["14b"], gpu="auto", context=8192) == 0
    out = capsys.readouterr().out
    assert "needs 2 GPUs: tensor parallel 2" in out and "this machine has 2" in out
    assert plan_report.run_plan(folders["14b"], gpu="auto", context=8192,
                                tensor_parallel=2) == 0
    out = capsys.readouterr().out
    assert "2 of this machine's 2 GPUs, the fullest with 23.00 GiB free" in out
    assert plan_report.run_plan(folders["14b"], gpu="auto", tensor_parallel=4) == 2
    assert "needs 4 GPUs and this machine has 2" in capsys.readouterr().err


def test_the_report_needs_no_torch():
    code = ("import sys, engine.tools.plan_multi_report, engine.parallel.request, "
            "engine.platform.child_env; "
            "bad = [m for m in ('torch', 'transformers', 'PySide6') if m in sys.modules]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
