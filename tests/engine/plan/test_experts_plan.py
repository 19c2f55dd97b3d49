"""The planner over a mixture of experts: the fit counts every expert's bytes, the decode
roofline only the top-k a token reads (plan/experts.py). Rows for the shapes in bench/
(Qwen3-30B-A3B and Mixtral-8x7B, config.json alone) at 4-bit on a 24 GiB card, against the
arithmetic by hand and the models' published sizes (30.5 B and 46.7 B parameters). The loader
keeps experts in 16 bits under every format (no 4-bit expert product yet), so the plan counts
them so: a 4-bit row quantizes only the rest, as the load would."""

from __future__ import annotations

import json

import pytest

from engine.formats.model_shape import ModelShape
from engine.plan.sizes import workspace_bytes
from engine.serve import cli
from tests.engine.helpers import REPO

GiB = 1 << 30


def _bf16(out: int, inp: int) -> int:
    return 2 * out * inp


def _plan(shape: str, capsys) -> dict:
    assert cli.main(["plan", "--model", str(REPO / "bench" / shape), "--vram", "24",
                     "--quant", "nf4", "--context", "8192", "--json"]) in (0, 2)
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("shape, params, layers, experts, top_k, hidden, width", [
    ("qwen3-30b-a3b", 30.5e9, 48, 128, 8, 2048, 768),
    ("mixtral-8x7b", 46.7e9, 32, 8, 2, 4096, 14336)])
def test_the_fit_counts_every_expert_and_the_roofline_the_active_ones(
        shape, params, layers, experts, top_k, hidden, width, capsys):
    p = _plan(shape, capsys)
    assert abs(p["params"] - params) < 0.05e9
    every = layers * experts * (2 * _bf16(width, hidden) + _bf16(hidden, width))
    assert p["weights_bytes"] - every > 0  # attention, router, norms, embedding, lm_head
    assert p["active_weights_bytes"] == p["weights_bytes"] - every + every * top_k // experts
    assert p["fits"] is False and p["total_bytes"] > 24 * GiB
    assert any(f"reads {top_k} of them" in n and "16 bits" in n for n in p["notes"])


def test_the_rows_on_a_24_gib_card(capsys):
    """With 16-bit experts neither fits a 24 GiB card at nf4: Qwen3-30B-A3B's experts alone are
    54 GiB (48 layers x 128 experts x 3 x 768 x 2048 x 2 bytes), its weights 55.6 GiB, of which a
    token reads 5.0 GiB; Mixtral-8x7B's 85.1 GiB, of which a token reads 22.1 GiB."""
    qwen, mixtral = _plan("qwen3-30b-a3b", capsys), _plan("mixtral-8x7b", capsys)
    assert 55 * GiB < qwen["weights_bytes"] < 56 * GiB and qwen["max_context"] == 0
    assert 4.9 * GiB < qwen["active_weights_bytes"] < 5.1 * GiB
    assert 85 * GiB < mixtral["weights_bytes"] < 85.5 * GiB and mixtral["max_context"] == 0
    assert 22 * GiB < mixtral["active_weights_bytes"] < 22.3 * GiB



def test_a_prefill_chunks_workspace_holds_each_tokens_top_k_experts():
    shape = ModelShape.from_folder(REPO / "bench" / "qwen3-30b-a3b")
    per_token = workspace_bytes(shape, "bf16", "bf16", 513, 1, 0) - workspace_bytes(
        shape, "bf16", "bf16", 512, 1, 0)
    # bf16: residual, norm, attention and MLP outputs; q, k, v and attention; 8 experts' gate,
    # up, SiLU(gate) * up (768 each) and output (2048)
    assert per_token == 2 * (4 * 2048 + (32 + 4) * 2 * 128 + 8 * (3 * 768 + 2048))
