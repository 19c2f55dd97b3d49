"""Prefill chunks replayed as CUDA graphs (step/prefill_graphs.py) on a GPU (the GPU machine runs
these): a replay gives the bits of the same padded chunk run eagerly, in bf16 with the demo
model and in AWQ with the Qwen2.5-7B shape (its int4 products through the tensor-core kernel up
to 64 rows and the dequantized buffer past them); padding moves an fp32 chunk's logits no more
than its own rounding; answers over several turns are the eager prefill's token for token; past
the graph budget chunks run eagerly. The token buckets, and what a failed capture leaves, are
checked on any machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.events import GenerateRequest, LoadRequest, SamplingParams
from engine.generate.session import Session
from engine.step import prefill_graphs
from engine.step.decode import bucket
from engine.step.prefill_graphs import token_bucket
from tests.engine.helpers import token_ids

GPU = pytest.mark.skipif(not torch.cuda.is_available(),
                         reason="needs a CUDA GPU")
SHAPE_7B = Path(__file__).resolve().parents[3] / "bench" / "qwen2.5-7b"
CHUNKS = [(0, 5), (0, 100), (0, 300), (200, 40), (333, 64), (0, 1000)]  # (start, tokens)


def test_token_buckets():
    assert [token_bucket(T) for T in (1, 15, 16, 17, 64, 65, 1000, 1024)] == \
        [16, 16, 16, 32, 64, 128, 1024, 1024]


def test_a_failed_capture_says_so_and_turns_capture_off(monkeypatch):
    """Any machine: the capture raises (as CPU torch's does); the eager chunk's logits still come
    back, the Decoder's notes say why, and later chunks are left to the caller (None)."""
    class Family:
        def block(self, tokens, pos, kv_len, keep, chunk):
            return torch.arange(8.0)[None] + pos[keep]  # [1, V]

    def refuse(*args, **kwargs):
        raise RuntimeError("no capture here")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", refuse)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    notes: list[str] = []
    g = prefill_graphs.PrefillGraphs(Family(), type("Cache", (), {"max_len": 64})(),
                                     torch.device("cpu"), notes)
    logits = g.run(torch.arange(5), 3, 32)
    assert torch.equal(logits, torch.arange(8.0) + 7)  # the last real row: position 3 + 4
    assert g.failure == "RuntimeError: no capture here" and not g.graphs
    assert notes == ["prefill chunk capture failed (RuntimeError: no capture here); prompts run "
                     "eagerly from now on"]
    assert g.run(torch.arange(5), 3, 32) is None


def _ids(n: int, seed: int, vocab: int = 2000) -> torch.Tensor:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).cuda()


def replays_equal_padded_eager(s: Session, chunks=CHUNKS) -> None:
    """Each chunk twice (the capture's eager run, then a replay), against the graph's own body
    run eagerly over the same inputs: the same bits."""
    d = s.decoder
    g = d.prefill_graphs
    assert g is not None, d.notes
    for i, (start, T) in enumerate(chunks):
        if start:
            d.forward(_ids(start, 100 + i), 0)
        ids = _ids(T, i)
        first = d.forward(ids, start).clone()
        again = d.forward(ids, start).clone()
        key = (token_bucket(T), bucket(d.buckets, start + T))
        assert key in g.graphs, (key, g.failure)
        with torch.inference_mode():
            eager = g._body(*key)[0]
        assert torch.equal(again, eager), (start, T)
        assert torch.equal(first, eager), (start, T)


@GPU
def test_bf16_replays_have_the_eager_chunks_bits():
    s = Session.load(LoadRequest(device="cuda", quant="bf16", context=1024))
    assert s.decoder.mode == "graph"
    replays_equal_padded_eager(s)


@GPU
def test_padding_moves_fp32_logits_only_by_rounding():
    s = Session.load(LoadRequest(device="cuda", quant="fp32", kv_dtype="fp32", context=1024))
    d = s.decoder
    for start, T in CHUNKS:
        if start:
            d.forward(_ids(start, 7), 0)
        ids = _ids(T, start + T)
        replayed = d.forward(ids, start).clone()
        pos = torch.arange(start, start + T, device="cuda")
        with torch.inference_mode():
            alone = d.family.block(ids, pos, bucket(d.buckets, start + T), last_only=True,
                                   chunk=True)[-1]
        assert ((replayed - alone).norm() / alone.norm()).item() < 1e-5, (start, T)
        assert replayed.argmax() == alone.argmax()


def _turns(s: Session) -> list[list[int]]:
    """Three turns of one conversation, each prompt the last one, its answer and more."""
    ids, answers = _ids(150, 1).tolist(), []
    for turn in range(3):
        req = GenerateRequest(prompt_ids=tuple(ids), max_new_tokens=24, ignore_eos=True,
                              sampling=SamplingParams(temperature=0.0))
        answers.append(token_ids(list(s.generate(req))))
        ids = ids + answers[-1] + _ids(20 + 30 * turn, 50 + turn).tolist()
    return answers


@GPU
def test_answers_over_turns_equal_eager_prefill(monkeypatch):
    graphed = Session.load(LoadRequest(device="cuda", quant="fp32", kv_dtype="fp32"))
    monkeypatch.setenv("HEARTH_PREFILL_GRAPHS", "off")
    eager = Session.load(LoadRequest(device="cuda", quant="fp32", kv_dtype="fp32"))
    assert graphed.decoder.prefill_graphs is not None and eager.decoder.prefill_graphs is None
    assert _turns(graphed) == _turns(eager)
    assert len(graphed.decoder.prefill_graphs.graphs) >= 3  # the prompt and two later turns


@GPU
def test_past_the_graph_budget_chunks_run_eagerly(monkeypatch):
    s = Session.load(LoadRequest(device="cuda", quant="bf16", context=1024))
    monkeypatch.setattr(prefill_graphs, "MAX_GRAPHS", 1)
    d = s.decoder
    d.forward(_ids(40, 1), 0)
    assert len(d.prefill_graphs.graphs) == 1
    assert d.prefill_graphs.run(_ids(300, 2), 0, bucket(d.buckets, 300)) is None
    out = d.forward(_ids(300, 2), 0)  # eager: still the chunk's logits
    pos = torch.arange(300, device="cuda")
    with torch.inference_mode():
        ref = d.family.block(_ids(300, 2), pos, bucket(d.buckets, 300), last_only=True,
                             chunk=True)[-1]
    assert torch.equal(out, ref)
    assert len(d.prefill_graphs.graphs) == 1


@GPU
def test_awq_7b_shape_replays_have_the_eager_chunks_bits():
    from engine.files.model_folder import config_only_folder
    from engine.load import loader

    req = LoadRequest(model=str(SHAPE_7B), device="cuda", quant="awq", context=2048)
    s = Session(loader.random_model(config_only_folder(str(SHAPE_7B)), req))
    try:
        assert s.decoder.mode == "graph"
        replays_equal_padded_eager(s, [(0, 40), (0, 300), (100, 20)])
    finally:
        del s
        torch.cuda.empty_cache()
