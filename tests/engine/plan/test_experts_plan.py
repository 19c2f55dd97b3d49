"""The planner over a mixture of experts: the fit counts every expert's bytes, the decode
roofline only the top-k a token reads (plan/experts.py). Rows for the shapes in bench/
(Qwen3-30B-A3B and Mixtral-8x7B, config.json alone) at 4-bit on a 24 GiB card, against the
arithmetic by hand and the models' published sizes (30.5 B and 46.7 B parameters)."""

from __future__ import annotations

import json

import pytest

from engine.formats.model_shape import ModelShape
from engine.plan.sizes import workspace_bytes
from engine.serve import cli
from tests.engine.helpers import REPO

GiB = 1 << 30


def _awq(out: int, inp: int, group: int = 128) -> int:
    """An AWQ linear: qweight [in, out/8] int32, qzeros [in/g, out/8] int32, scales [in/g, out]
    fp16."""
    groups, packed = -(-inp // group), 4 * -(-out // 8)
    return inp * packed + groups * packed + groups * out * 2


def _plan(shape: str, capsys) -> dict:
    assert cli.main(["plan", "--model", str(REPO / "bench" / shape), "--vram", "24",
                     "--quant", "awq", "--context", "8192", "--json"]) in (0, 2)
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("shape, params, layers, experts, top_k, hidden, width, fits", [
    ("qwen3-30b-a3b", 30.5e9, 48, 128, 8, 2048, 768, True),
    ("mixtral-8x7b", 46.7e9, 32, 8, 2, 4096, 14336, False)])
def test_the_fit_counts_every_expert_and_the_roofline_the_active_ones(
        shape, params, layers, experts, top_k, hidden, width, fits, capsys):
    p = _plan(shape, capsys)
    assert abs(p["params"] - params) < 0.05e9
    every = layers * experts * (2 * _awq(width, hidden) + _awq(hidden, width))
    assert p["weights_bytes"] - every > 0  # attention, router, norms, embedding, lm_head
    assert p["active_weights_bytes"] == p["weights_bytes"] - every + every * top_k // experts
    assert p["fits"] is fits and (p["total_bytes"] <= 24 * GiB) is fits
    assert any(f"reads {top_k} of them" in n for n in p["notes"])


def test_the_rows_on_a_24_gib_card(capsys):
    """Qwen3-30B-A3B at 4-bit fits with room for its whole 40,960-token context and reads
    about 2.5 GiB a token; Mixtral-8x7B's 4-bit weights alone are about 23 GiB, past a 24 GiB
    card once the CUDA context and margin are added."""
    qwen, mixtral = _plan("qwen3-30b-a3b", capsys), _plan("mixtral-8x7b", capsys)
    assert 15 * GiB < qwen["weights_bytes"] < 16 * GiB and qwen["max_context"] == 40960
    assert 2.4 * GiB < qwen["active_weights_bytes"] < 2.6 * GiB
    assert 22.5 * GiB < mixtral["weights_bytes"] < 23.5 * GiB and mixtral["max_context"] == 0
    assert 6.5 * GiB < mixtral["active_weights_bytes"] < 6.7 * GiB



def test_a_prefill_chunks_workspace_holds_each_tokens_top_k_experts():
    shape = ModelShape.from_folder(REPO / "bench" / "qwen3-30b-a3b")
    per_token = workspace_bytes(shape, "bf16", "bf16", 513, 1, 0) - workspace_bytes(
        shape, "bf16", "bf16", 512, 1, 0)
    # bf16: residual, norm, attention and MLP outputs; q, k, v and attention; 8 experts' gate,
    # up, SiLU(gate) * up (768 each) and output (2048)
    assert per_token == 2 * (4 * 2048 + (32 + 4) * 2 * 128 + 8 * (3 * 768 + 2048))
