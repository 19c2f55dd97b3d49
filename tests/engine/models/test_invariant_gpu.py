"""The reproducible mode on a GPU: the demo model and the Qwen2.5-7B
shape with random weights (bf16 and AWQ), each row of blocks of 1 to 64 tokens against its
decode steps (captured graphs, the Triton decode kernel and fused pieces), and the pieces
themselves row by row, the fused Triton ones included. The real model cannot travel there."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.events import LoadRequest
from engine.generate.session import Session
from tests.engine.models.test_invariant import pieces_work_row_by_row, same_bits_as_steps

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU")
SHAPE_7B = Path(__file__).resolve().parents[3] / "bench" / "qwen2.5-7b"


@pytest.fixture(scope="module")
def demo():
    s = Session.load(LoadRequest(device="cuda", quant="bf16", reproducible=True))
    assert s.config.reproducible and s.decoder.mode == "graph"
    return s


def _random_7b(quant: str) -> Session:
    from engine.files.model_folder import config_only_folder
    from engine.load import loader

    req = LoadRequest(model=str(SHAPE_7B), device="cuda", quant=quant, context=512)
    return Session(loader.random_model(config_only_folder(str(SHAPE_7B)), req),
                   reproducible=True)


@pytest.mark.parametrize("start", [0, 230])
def test_demo_model_rows_get_their_decode_steps_bits(demo, start):
    same_bits_as_steps(demo, start)


def test_demo_model_pieces_work_row_by_row_fused_too(demo):
    step = demo.decoder.family
    pieces_work_row_by_row(step, step.eager_fns)
    pieces_work_row_by_row(step, step.fns)  # the Triton pieces where they run


def test_demo_model_answers_do_not_depend_on_how_they_were_computed(demo):
    """The SmolLM2 tests' end-to-end checks on the GPU with the demo model: warm = cold over
    three turns, the same request twice, prompt lookup = plain, chunk sizes 1 to 512."""
    from tests.engine.generate import test_reproducible_smollm2 as e2e

    e2e.test_warm_equals_cold_over_three_turns(demo)
    e2e.test_the_same_request_twice_gives_the_same_tokens(demo)
    e2e.test_prompt_lookup_gives_the_plain_tokens(demo)
    for question in e2e.CHUNK_PROMPTS:
        e2e.test_prefill_chunk_sizes_give_the_same_tokens(demo, question)


@pytest.mark.parametrize("quant", ["bf16", "awq"])
def test_7b_shape_rows_get_their_decode_steps_bits(quant):
    s = _random_7b(quant)
    try:
        assert s.config.reproducible
        print(s.decoder.notes)
        same_bits_as_steps(s, 230, counts=(1, 2, 7, 16, 17, 33, 64))
    finally:
        del s
        torch.cuda.empty_cache()
