"""A KV dtype registered in one place (engine/formats/kv_dtypes.py) reaches everything that names
KV dtypes: the CLI, the planner, request checks, the app's fit table and the torch-side arena."""

from __future__ import annotations

import json

import pytest
import torch

from app.models import fit_check
from engine.cache.kv_arena import KVArena
from engine.cli import cli
from engine.events import BadRequest, LoadRequest, request_from_json, request_to_json
from engine.formats import kv_dtypes
from engine.formats.model_shape import ModelShape
from engine.plan.memory import GiB, kv_bytes_per_token, plan

# a Qwen2-0.5B-like shape: 24 layers, 2 KV heads of 64
CONFIG = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=896,
              num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
              intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
              max_position_embeddings=32768, torch_dtype="bfloat16")
FP16X = kv_dtypes.KVDtype("fp16x", 2, "float16")  # fp16 under another name: 2 bytes, unscaled


@pytest.fixture
def fp16x():
    kv_dtypes.register(FP16X)  # the one place a new KV dtype is written down
    yield FP16X
    kv_dtypes.unregister(FP16X.name)


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    return str(tmp_path)


def _plan_json(folder: str, capsys, *flags: str) -> tuple[int, dict | None]:
    rc = cli.main(["plan", "--model", folder, "--vram", "24", "--context", "4096", "--json",
                   *flags])
    out = capsys.readouterr().out
    return rc, json.loads(out) if out.strip() else None


def test_unknown_until_registered(folder, capsys):
    """Every door refuses it first, so what the other tests see is the registry's doing."""
    with pytest.raises(BadRequest, match="unknown --kv-dtype 'fp16x'"):
        LoadRequest(kv_dtype="fp16x").validate()
    assert _plan_json(folder, capsys, "--kv-dtype", "fp16x")[0] == 2
    assert "fp16x" not in fit_check.kv_choices() and "fp16x" not in _help("plan", capsys)
    with pytest.raises(ValueError, match="unknown KV dtype 'fp16x'"):
        kv_bytes_per_token(ModelShape.from_config(CONFIG), "fp16x")


def test_cli_offers_and_plans_it(fp16x, folder, capsys):
    for command in ("plan", "run", "bench", "eval"):
        assert "--kv-dtype KV_DTYPE one of auto, bf16, fp16, fp32, fp8, int8, fp16x" in (
            _help(command, capsys))
    rc, out = _plan_json(folder, capsys, "--kv-dtype", "fp16x")
    assert rc == 0 and out["kv_dtype"] == "fp16x"
    assert out["kv_bytes_per_token"] == 24 * 2 * 2 * 64 * 2  # layers x KV heads x K,V x D x 2 B
    rc, fp16 = _plan_json(folder, capsys, "--kv-dtype", "fp16")
    assert (out["kv_bytes"], out["total_bytes"]) == (fp16["kv_bytes"], fp16["total_bytes"])


def _help(command: str, capsys) -> str:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal's width


def test_planner_counts_it(fp16x):
    shape = ModelShape.from_config(CONFIG)
    assert kv_bytes_per_token(shape, "fp16x") == 24 * 2 * 2 * 64 * 2
    p = plan(shape, "bf16", "fp16x", 8192, 24 * GiB)
    assert (p.kv_dtype, p.fits) == ("fp16x", True)
    assert p.kv_bytes == plan(shape, "bf16", "fp16", 8192, 24 * GiB).kv_bytes
    # unscaled: 2 bytes a value and no scales, half of fp32's and more than int8's with scales
    assert kv_bytes_per_token(shape, "fp32") == 2 * kv_bytes_per_token(shape, "fp16x")
    assert kv_bytes_per_token(shape, "int8") == 24 * 2 * 2 * (64 + 2 * 2)  # a scale per 32


def test_requests_accept_it(fp16x):
    LoadRequest(kv_dtype="fp16x").validate()
    LoadRequest(kv_dtype="fp16x", tensor_parallel=2).validate()  # unscaled: a split keeps it
    sent = request_from_json(request_to_json(LoadRequest(kv_dtype="fp16x")))
    assert sent == LoadRequest(kv_dtype="fp16x")
    sent.validate()
    with pytest.raises(BadRequest, match="choose one of auto, bf16, fp16, fp32, fp8, int8, fp16x$"):
        LoadRequest(kv_dtype="fp17").validate()


def test_fit_table_offers_it(fp16x):
    assert fit_check.kv_choices() == ("auto", "bf16", "fp16", "fp8", "int8", "fp16x")
    shape = ModelShape.from_config(CONFIG)
    table = fit_check.fit_table(shape, None, kv_dtype="fp16x", context=4096)
    fp16 = fit_check.fit_table(shape, None, kv_dtype="fp16", context=4096)
    assert [r.quant for r in table.rows] == ["bf16", "fp16", "int8", "nf4", "awq"]
    assert {r.kv_dtype for r in table.rows} == {"fp16x"}
    assert [r.kv_bytes for r in table.rows] == [r.kv_bytes for r in fp16.rows]


def test_arena_stores_it(fp16x):
    arena = KVArena(2, 2, 64, 3, 16, "fp16x", "cpu")
    assert arena.k[0].dtype is torch.float16 and not arena.quantized and arena.k_scale is None
    # the arena's bytes per block are the planner's bytes per token times the block
    shape = ModelShape.from_config(dict(CONFIG, num_hidden_layers=2))
    for name in ("fp16x", "fp32", "fp8", "int8"):
        assert KVArena.bytes_per_block(2, 2, 64, 16, name) == 16 * kv_bytes_per_token(shape, name)


def test_registry_facts():
    assert kv_dtypes.quantized() == ("fp8", "int8")
    assert [kv_dtypes.eight_bit_for(cc) for cc in ((9, 0), (8, 9), (8, 6), None)] == [
        "fp8", "fp8", "int8", "int8"]
    assert kv_dtypes.runs_natively("bf16", None) and not kv_dtypes.runs_natively("fp8", (8, 0))
    for taken in ("auto", "int8"):
        with pytest.raises(ValueError, match="is taken"):
            kv_dtypes.register(kv_dtypes.KVDtype(taken, 1, "int8"))
    with pytest.raises(ValueError, match="needs its qmax"):
        kv_dtypes.register(kv_dtypes.KVDtype("int4x", 1, "int8", scaled=True))
    assert "int4x" not in kv_dtypes.names()
