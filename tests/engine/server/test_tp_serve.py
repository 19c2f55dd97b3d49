"""`hearth serve --tensor-parallel 2 --device cpu` (rank 0 in the server, rank 1 a gloo
process): a split model serves in batches. 8 concurrent requests each give the answer the
unsplit model gives it alone (fp32 greedy); the server says how many run together and never
"one at a time", and /health reports the engine's max_seqs (tests/engine/parallel/test_tp_batch.py
shows the batched steps on both ranks)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine.events import GenerateRequest, LoadRequest, SamplingParams, Token
from tests.engine.helpers import hearth_serve, stop_server

PROMPTS = ("The quick brown fox", "A zipfile module explains the", "hello hello world of the",
           "one two three four five six seven", "The model", "Tell me about foxes and dogs",
           "zip it", "What does the locale module")
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def served(tiny_model):
    """The server over 2 ranks: one 2-rank start for the module."""
    proc, url = hearth_serve("--model", str(tiny_model), "--tensor-parallel", "2",
                             "--max-seqs", "8", "--context", "512")
    yield proc, url
    stop_server(proc)


def alone(tiny_model) -> tuple[list[list[int]], list[str]]:
    """Each prompt's ids and its greedy answer from the unsplit model, one at a time."""
    from engine.generate.session import Session

    session = Session.load(LoadRequest(str(tiny_model), device="cpu", context=512))
    ids = [session.lm.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    texts = []
    for prompt_ids in ids:
        req = GenerateRequest(prompt_ids=tuple(prompt_ids), max_new_tokens=MAX_TOKENS,
                              ignore_eos=True, sampling=SamplingParams(temperature=0.0))
        texts.append("".join(e.text for e in session.generate(req) if isinstance(e, Token)))
    return ids, texts


def test_eight_concurrent_requests_give_their_answers_alone(served, tiny_model, one_thread):
    proc, url = served
    assert "up to 8 requests run together (--max-seqs)" in proc.startup
    assert "one at a time" not in proc.startup
    ids, expected = alone(tiny_model)
    base = url.removesuffix("/v1")

    def complete(prompt_ids: list[int]) -> str:
        r = httpx.post(f"{url}/completions", timeout=300, json={
            "model": tiny_model.name, "prompt": prompt_ids, "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(complete, ids))
    assert got == expected
    health = httpx.get(f"{base}/health", timeout=10).json()
    assert health["max_seqs"] == 8


@pytest.mark.parametrize("flags, words", [
    (["--tensor-parallel", "0"], "--tensor-parallel takes a whole number of GPUs, 1 or more"),
    (["--tensor-parallel", "3", "--device", "cpu"], "--tensor-parallel takes 2"),
])
def test_a_split_that_cannot_run_is_refused_before_binding(flags, words, tiny_model, capsys):
    from engine.cli import cli

    assert cli.main(["serve", "--model", str(tiny_model), "--port", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert words in err
