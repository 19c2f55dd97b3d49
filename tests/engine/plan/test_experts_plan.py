"""The planner over a mixture of experts: the fit counts every expert's bytes, the decode
roofline only the top-k a token reads (plan/experts.py). Rows for the shapes in bench/
(Qwen3-30B-A3B and Mixtral-8x7B, config.json alone) at 4-bit on a 24 GiB card, against the
arithmetic by hand and the models' published sizes (30.5 B and 46.7 B parameters). Under awq
and nf4 the loader keeps experts in 4 bits (quant/experts4.py), under int8 in 16 bits: the plan
counts them as the load keeps them."""

from __future__ import annotations

import json

import pytest

from engine.cli import cli
from engine.formats.model_shape import ModelShape
from engine.plan.sizes import workspace_bytes
from tests.engine.helpers import REPO

GiB = 1 << 30


def _bf16(out: int, inp: int) -> int:
    return 2 * out * inp


def _four_bit(out: int, inp: int) -> int:
    """awq: 4 bits a weight, a bf16 scale and offset per 128 inputs (4 bytes / 128 weights);
    nf4: a bf16 absmax per 64 (2 bytes / 64 weights): 17/32 bytes a weight either way."""
    return out * inp * 17 // 32


def _plan(shape: str, capsys, quant: str = "nf4", vram: int = 24) -> dict:
    assert cli.main(["plan", "--model", str(REPO / "bench" / shape), "--vram", str(vram),
                     "--quant", quant, "--context", "8192", "--json"]) in (0, 2)
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("quant, size, form", [
    ("awq", _four_bit, "in 4 bits, a 16-bit scale and offset per 128 inputs"),
    ("nf4", _four_bit, "in 4 bits, a 16-bit scale per 64 inputs"),
    ("int8", _bf16, "in 16 bits: int8 keeps experts so")])
@pytest.mark.parametrize("shape, params, layers, experts, top_k, hidden, width", [
    ("qwen3-30b-a3b", 30.5e9, 48, 128, 8, 2048, 768),
    ("mixtral-8x7b", 46.7e9, 32, 8, 2, 4096, 14336)])
def test_the_fit_counts_every_expert_and_the_roofline_the_active_ones(
        shape, params, layers, experts, top_k, hidden, width, quant, size, form, capsys):
    p = _plan(shape, capsys, quant)
    assert abs(p["params"] - params) < 0.05e9
    every = layers * experts * (2 * size(width, hidden) + size(hidden, width))
    assert p["weights_bytes"] - every > 0  # attention, router, norms, embedding, lm_head
    assert p["active_weights_bytes"] == p["weights_bytes"] - every + every * top_k // experts
    assert any(f"reads {top_k} of them" in n and form in n for n in p["notes"])


@pytest.mark.parametrize("quant", ["awq", "nf4"])
def test_the_rows_on_a_24_gib_card(quant, capsys):
    """Qwen3-30B-A3B with 4-bit experts fits a 24 GiB card at 8K context: its experts are
    14.34 GiB (48 layers x 128 experts x 3 x 768 x 2048 x 17/32 bytes), its weights 16.0 GiB,
    of which a token reads 2.5 GiB. Mixtral-8x7B's 4-bit weights alone are 23.5 GiB (22.3 GiB
    of experts, 5.6 GiB of them a token's): with the KV cache, the CUDA context and the margin
    it needs a 32 GiB card."""
    qwen, mixtral = _plan("qwen3-30b-a3b", capsys, quant), _plan("mixtral-8x7b", capsys, quant)
    assert 15.9 * GiB < qwen["weights_bytes"] < 16.0 * GiB
    assert qwen["fits"] is True and qwen["total_bytes"] < 24 * GiB
    assert qwen["max_context"] >= 32768
    assert 2.5 * GiB < qwen["active_weights_bytes"] < 2.55 * GiB
    assert 23.4 * GiB < mixtral["weights_bytes"] < 23.5 * GiB
    assert mixtral["fits"] is False and mixtral["total_bytes"] > 24 * GiB
    assert 6.7 * GiB < mixtral["active_weights_bytes"] < 6.8 * GiB
    on_32 = _plan("mixtral-8x7b", capsys, quant, vram=32)
    assert on_32["fits"] is True and on_32["total_bytes"] < 32 * GiB



def test_a_prefill_chunks_workspace_holds_each_tokens_top_k_experts():
    shape = ModelShape.from_folder(REPO / "bench" / "qwen3-30b-a3b")
    per_token = workspace_bytes(shape, "bf16", "bf16", 513, 1, 0) - workspace_bytes(
        shape, "bf16", "bf16", 512, 1, 0)
    # bf16: residual, norm, attention and MLP outputs; q, k, v and attention; 8 experts' gate,
    # up, SiLU(gate) * up (768 each) and output (2048)
    assert per_token == 2 * (4 * 2048 + (32 + 4) * 2 * 128 + 8 * (3 * 768 + 2048))
