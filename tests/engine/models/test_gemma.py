"""Gemma 3 and Gemma 2 on the engine's own step (models/gemma_step.py) against transformers, fp32
on the CPU: local layers of a 16-token window between global ones, prompts several windows long.
Greedy tokens equal transformers' token for token; bf16 logits within bf16's own distance from
fp32; batched rows give what each gives alone; a Gemma3ForConditionalGeneration checkpoint loads
its language model alone; Gemma 2's soft-capped attention on the step as in transformers."""

from __future__ import annotations

import pytest
import torch

from engine.events import LoadRequest
from engine.generate.session import Session
from engine.models.gemma_step import GemmaStep
from tests.engine.generate.test_batch_run import concurrent_equals_alone, teacher_forced_rows
from tests.engine.helpers import PROMPT, greedy_request, hf_greedy, token_ids
from tests.fixtures import gemma

LONG_PROMPT = (PROMPT + " ") * 5
N_NEW = 40


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer_dir):
    root = tmp_path_factory.mktemp("gemma3")
    return {"causal": gemma.build(root / "causal", tokenizer_dir),
            "conditional": gemma.build(root / "conditional", tokenizer_dir, conditional=True),
            "bf16": gemma.build(root / "bf16", tokenizer_dir, dtype="bfloat16"),
            "gemma2": gemma.build(root / "gemma2", tokenizer_dir, gemma2=True)}


@pytest.fixture(scope="module")
def session(folders, one_thread):
    return Session.load(LoadRequest(str(folders["causal"]), device="cpu"))


@pytest.fixture(scope="module")
def reference(folders):
    return hf_greedy(folders["causal"], LONG_PROMPT, N_NEW)


def test_greedy_equals_transformers_past_four_windows(session, reference):
    assert isinstance(session.decoder.family, GemmaStep) and session.decoder.mode == "static"
    n_prompt = len(session.prompt_ids(greedy_request(LONG_PROMPT)))
    assert n_prompt >= 4 * gemma.WINDOW
    got = token_ids(list(session.generate(greedy_request(LONG_PROMPT, n=N_NEW))))
    assert len(set(reference)) >= 8  # the random model wanders: a wrong layer would show
    assert got == reference


def test_transformers_modules_with_the_engines_attention_mask_the_window(folders, reference):
    # the eager path: every pass through transformers' modules and attention/prefill.py
    eager = Session.load(LoadRequest(str(folders["causal"]), device="cpu", context=512,
                                     eager=True))
    assert eager.decoder.mode == "generic"
    assert token_ids(list(eager.generate(greedy_request(LONG_PROMPT, n=N_NEW)))) == reference


def test_conditional_generation_loads_its_language_model(folders, reference):
    from transformers import Gemma3ForCausalLM

    s = Session.load(LoadRequest(str(folders["conditional"]), device="cpu", context=512))
    assert type(s.lm.model) is Gemma3ForCausalLM  # no vision tower in memory
    assert isinstance(s.decoder.family, GemmaStep)
    assert token_ids(list(s.generate(greedy_request(LONG_PROMPT, n=N_NEW)))) == reference


def _teacher_forced(session: Session, ids: torch.Tensor, start: int) -> torch.Tensor:
    session.decoder.forward(ids[:start], 0)
    return torch.stack([session.decoder.step(ids[p:p + 1], p).float().reshape(-1).clone()
                        for p in range(start, len(ids))])


def test_bf16_logits_are_as_close_to_fp32_as_transformers_bf16(folders):
    """The bf16 step against the same weights in fp32, teacher-forced past several windows: no
    farther than transformers' own modules in bf16 are (bf16's rounding is the yardstick)."""
    ids = torch.randint(3, 2048, (96,), generator=torch.Generator().manual_seed(5))
    path = str(folders["bf16"])
    fast = _teacher_forced(Session.load(LoadRequest(path, device="cpu", context=512)), ids, 40)
    modules = _teacher_forced(Session.load(LoadRequest(path, device="cpu", context=512,
                                                       eager=True)), ids, 40)
    exact = _teacher_forced(Session.load(LoadRequest(path, device="cpu", context=512,
                                                     quant="fp32")), ids, 40)
    rel = lambda a: (a - exact).norm(dim=-1) / exact.norm(dim=-1)  # noqa: E731
    assert rel(modules).median() > 0  # bf16 really rounds: the yardstick is not zero
    assert rel(fast).median() <= 1.5 * rel(modules).median(), (rel(fast), rel(modules))


def test_batched_rows_equal_each_row_alone(folders, one_thread):
    # an arena of three contexts: three sequences' rings for the sliding layers
    session = Session.load(LoadRequest(str(folders["causal"]), device="cpu",
                                       kv_tokens=3 * 2048))
    assert len(session.cache.blocks.sliding.free_ids) == 3 * session.cache.blocks.sliding.ring
    single, batched = teacher_forced_rows(session)  # rows 40 to 252 tokens long
    assert ((batched - single).norm(dim=-1) / single.norm(dim=-1)).max() < 1e-5
    assert session.decoder.family is not None  # its rows in the family step
    run = concurrent_equals_alone(session)
    assert max(run.engine.batch.rows_seen) >= 5


def test_gemma2_soft_capped_attention_on_the_step(folders):
    path = folders["gemma2"]
    reference = hf_greedy(path, LONG_PROMPT, N_NEW)  # transformers' eager attention: capped
    s = Session.load(LoadRequest(str(path), device="cpu", context=512))
    assert isinstance(s.decoder.family, GemmaStep) and s.decoder.family.gemma.attn_softcap == 5
    assert len(set(reference)) >= 8
    assert token_ids(list(s.generate(greedy_request(LONG_PROMPT, n=N_NEW)))) == reference
    single, batched = teacher_forced_rows(s, n_seqs=3, steps=4)
    assert ((batched - single).norm(dim=-1) / single.norm(dim=-1)).max() < 1e-5
