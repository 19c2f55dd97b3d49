"""The planner's prefill pass (plan/memory.py largest_prefill_chunk, generate/session_load.py): the
longest that fits the card, its activations within what a batch's KV arena leaves free, since a
step's token budget under continuous batching is this pass."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch

from engine.formats.model_shape import ModelShape
from engine.generate.session_load import ARENA_RESERVE_BYTES, arena_reserve, prefill_chunk_for
from engine.plan.memory import largest_prefill_chunk, plan

REPO = Path(__file__).resolve().parents[3]
SHAPE = ModelShape.from_config(
    json.loads((REPO / "bench/qwen2.5-7b/config.json").read_text()))
GiB = 2 ** 30


def _activations(chunk: int, vram: int) -> int:
    return plan(SHAPE, "bf16", "bf16", 4096, vram, prefill_chunk=chunk).activation_bytes


def test_the_longest_pass_that_fits_within_the_activation_bound():
    vram = 138 * GiB
    assert largest_prefill_chunk(SHAPE, "bf16", "bf16", 4096, vram) == 16384
    bound = _activations(8192, vram)
    assert _activations(16384, vram) > bound
    assert largest_prefill_chunk(SHAPE, "bf16", "bf16", 4096, vram,
                                 most_activation_bytes=bound) == 8192
    assert largest_prefill_chunk(SHAPE, "bf16", "bf16", 4096, vram,
                                 most_activation_bytes=bound - 1) == 4096


def test_a_card_too_small_for_any_pass_gets_the_smallest():
    assert largest_prefill_chunk(SHAPE, "bf16", "bf16", 4096, 8 * GiB) == 512


def test_the_session_keeps_the_pass_within_half_the_arenas_reserve():
    assert arena_reserve(8 * GiB) == ARENA_RESERVE_BYTES  # 2 GiB at least
    assert arena_reserve(138 * GiB) == int(138 * GiB * 0.10)
    folder = SimpleNamespace(config=json.loads(
        (REPO / "bench/qwen2.5-7b/config.json").read_text()))
    lm = SimpleNamespace(device=torch.device("cuda", 0), quant="bf16", folder=folder,
                         context=32768)
    on_a_140_gib_card = 138 * GiB
    assert prefill_chunk_for(lm, "bf16", on_a_140_gib_card) == 16384
    card_24 = int(23.5 * GiB)  # an 8K-token pass fits the card, but not half its reserve
    assert largest_prefill_chunk(SHAPE, "bf16", "bf16", 32768, card_24) >= 8192
    assert _activations(8192, card_24) > arena_reserve(card_24) // 2
    assert prefill_chunk_for(lm, "bf16", card_24) == 4096
    assert prefill_chunk_for(SimpleNamespace(**{**vars(lm), "device": torch.device("cpu")}),
                             "bf16", None) == 512  # the CPU: the smallest pass
