"""The sliding layers' rings (cache/sliding_pool.py) on a tiny Gemma 3, fp32 on the CPU: prefill
chunks of 24 tokens make each sequence's ring 3 blocks (48 tokens), so prompts eight windows long
wrap it three times and more, at windows that do and do not match the block size. Greedy tokens
equal transformers' token for token; a next turn reuses the ring, an edit or another
conversation's cached prefix computes the sliding K/V again without touching the shared global
blocks; the cache holds what the planner counts."""

from __future__ import annotations

import math

import pytest
import torch

from engine.cache.sliding_pool import recompute_start
from engine.events import LoadRequest
from engine.generate.session import Session
from engine.models.gemma_step import GemmaStep
from tests.engine.helpers import PROMPT, finished, greedy_request, hf_greedy, token_ids
from tests.fixtures import gemma

CHUNK = 24  # the prefill pass: a ring of ceil((window + 23) / 16) blocks
LONG = (PROMPT + " ") * 10  # past eight windows
N_NEW = 40


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer_dir):
    root = tmp_path_factory.mktemp("gemma_ring")
    return {"w16": gemma.build(root / "w16", tokenizer_dir),
            "w20": gemma.build(root / "w20", tokenizer_dir, sliding_window=20, seed=1)}


def _load(path, **kw) -> Session:
    with pytest.MonkeyPatch.context() as m:  # the prefill pass, made short
        m.setattr("engine.generate.session_load.prefill_chunk_for", lambda *a, **k: CHUNK)
        return Session.load(LoadRequest(str(path), **{"device": "cpu", "context": 512, **kw}))


@pytest.fixture(scope="module")
def sessions(folders, one_thread):
    return {name: _load(path) for name, path in folders.items()}


def _generate(session: Session, prompt: str, n: int = N_NEW):
    events = list(session.generate(greedy_request(prompt, n=n)))
    return token_ids(events), finished(events).stats


@pytest.mark.parametrize("name,window,ring", [("w16", 16, 3), ("w20", 20, 3)])
def test_a_prompt_many_windows_long_in_chunks_equals_transformers(sessions, folders, name,
                                                                  window, ring):
    s = sessions[name]
    assert isinstance(s.decoder.family, GemmaStep) and s.prefill_chunk == CHUNK
    pool = s.cache.blocks.sliding
    assert (pool.window, pool.ring, pool.num_blocks) == (window, ring, ring)  # one ring
    assert s.cache.ring_arena.k[0].shape[0] == ring + 1  # and its scratch block
    n_prompt = len(s.prompt_ids(greedy_request(LONG)))
    assert n_prompt >= 8 * window and n_prompt + N_NEW >= 3 * ring * s.cache.block_size
    s.cache.clear()
    got, _ = _generate(s, LONG)
    reference = hf_greedy(folders[name], LONG, N_NEW)
    assert len(set(reference)) >= 8  # the random model wanders: a wrong key would show
    assert got == reference


def _global_blocks(cache, block_ids: list[int]) -> list[torch.Tensor]:
    return [cache.k[i][block_ids].clone() for i in range(len(cache.k)) if i not in cache.sliding]


def test_next_turn_edit_and_another_conversations_prefix_equal_a_cold_run(sessions, folders):
    s, path = sessions["w16"], folders["w16"]
    s.cache.clear()
    first, _ = _generate(s, LONG)
    # a next turn after the answer, and an edit far back: each finds the earlier blocks by hash
    # (a batch keeps no live ring between turns), keeps their global K/V and computes the
    # sliding K/V again from three windows (three sliding layers) before them
    second = LONG + s.lm.tokenizer.decode(first) + " and then the tarfile module too"
    edit = (PROMPT + " ") * 8 + "but the gzip module"
    for prompt in (second, edit):
        ids = s.prompt_ids(greedy_request(prompt))
        keep = len(s.cache.blocks.cached_prefix(ids[:-1])) * s.cache.block_size
        got, stats = _generate(s, prompt)
        assert 0 < stats.cached_prompt_tokens == recompute_start(keep, gemma.WINDOW, 3, 16)
        assert got == hf_greedy(path, prompt, N_NEW)
    # another conversation over the first one's cached blocks (found by hash)
    ids = s.prompt_ids(greedy_request(second))
    shared = s.cache.blocks.cached_prefix(ids[:-1])
    _generate(s, "An unrelated question about tar files", 4)  # the live conversation changes
    before = _global_blocks(s.cache, shared)
    got, stats = _generate(s, second)
    # a hit, its sliding K/V computed again from before it
    assert 0 < stats.cached_prompt_tokens < len(shared) * s.cache.block_size
    assert got == hf_greedy(path, second, N_NEW)
    after = _global_blocks(s.cache, shared)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_the_cache_holds_what_the_planner_counts(sessions, folders):
    """The cache's arenas, byte for byte, against the planner's KV figure for the same shape,
    context and pass (+ the scratch block of each arena, which the planner counts apart)."""
    from engine.formats.model_shape import ModelShape
    from engine.plan.memory import plan
    from engine.plan.sizes import kv_bytes_per_token

    for name, s in sessions.items():
        shape = ModelShape.from_folder(folders[name])
        assert (shape.local_layers, shape.local_window) == (3, s.cache.blocks.sliding.window)
        p = plan(shape, "fp32", "fp32", 512, prefill_chunk=CHUNK, device="cpu")
        scratch = kv_bytes_per_token(shape, "fp32") * s.cache.block_size
        assert s.cache.num_bytes == p.kv_bytes + scratch
        # one global layer at 512 tokens and three sliding ones at a ring of 48
        assert p.kv_bytes == (512 + 3 * 48) * kv_bytes_per_token(shape, "fp32") // 4


@pytest.mark.parametrize("context", [32768, 131072])
def test_a_gemma_3_12b_shaped_cache_holds_what_the_planner_counts(context):
    """The arenas allocated (on the meta device: no memory) for bench/gemma-3-12b's shape, byte
    for byte against `hearth plan`'s KV figure: 8 global layers at the context, 40 sliding ones
    at a ring of 96 blocks (1,024 + 512 - 1 tokens), and a scratch block each."""
    from engine.cache.kv_cache import KVCache
    from engine.formats.model_shape import ModelShape
    from engine.plan.memory import plan
    from tests.engine.helpers import REPO

    shape = ModelShape.from_folder(REPO / "bench" / "gemma-3-12b")
    p = plan(shape, "nf4", "bf16", context, prefill_chunk=512)
    sliding = tuple(i for i in range(48) if (i + 1) % 6)  # every sixth layer global
    cache = KVCache(48, 8, 256, context, "bf16", "meta", sliding_layers=sliding, window=1024,
                    max_pass=512)
    layer = 2 * 8 * 256 * 2  # a token of a layer: K and V, 8 KV heads of 256, bf16
    assert p.kv_bytes == 8 * layer * context + 40 * layer * 96 * 16
    assert cache.num_bytes == p.kv_bytes + 48 * layer * 16  # + the scratch blocks
    assert cache.num_bytes < 48 * layer * context / (5 if context > 32768 else 4)


def test_a_text_scored_in_one_pass_longer_than_the_ring_equals_transformers(sessions, folders):
    """hearth eval's window, a pass from position 0 through transformers' modules longer than
    the ring covers: the sliding layers attend over the pass's own K/V."""
    from transformers import AutoModelForCausalLM

    from engine.tools.eval import perplexity

    s = sessions["w16"]
    ids = s.prompt_ids(greedy_request(LONG))
    s.cache.clear()
    got = perplexity(s, ids)
    s.cache.clear()  # the text was written over the session's cache
    model = AutoModelForCausalLM.from_pretrained(folders["w16"], dtype=torch.float32).eval()
    with torch.no_grad():
        loss = model(torch.tensor([ids]), labels=torch.tensor([ids])).loss
    assert len(ids) > 3 * CHUNK and got.tokens == len(ids) - 1
    assert abs(got.perplexity / math.exp(float(loss)) - 1) < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_captured_steps_and_batched_rows_read_the_rings(folders, one_thread):
    """Decode steps captured as CUDA graphs hold the ring tables' addresses: teacher-forced over
    a prompt that wraps the ring several times, each captured step's logits are the same step's
    computed eagerly over the same rings (a greedy run against transformers on the CPU can flip
    a near tie of this random model between devices: the CPU tests above hold the tokens).
    Rows of a batch each read their own ring: batched equals alone."""
    from tests.engine.generate.test_batch_run import concurrent_equals_alone

    s = _load(folders["w16"], device="cuda", kv_tokens=4 * 512, quant="fp32")  # four rings
    assert s.decoder.mode == "graph" and len(s.cache.blocks.sliding.free_ids) == 4 * 3
    ring_tokens = s.cache.blocks.sliding.ring * s.cache.block_size
    ids = torch.tensor(s.prompt_ids(greedy_request(LONG)), device="cuda")
    start = CHUNK
    assert len(ids) - start >= 2 * ring_tokens  # the steps wrap the ring twice and more
    cpu = _load(folders["w16"])  # the same steps on the CPU: another kernel, another device
    cpu.cache.clear()
    cpu.decoder.forward(ids[:start].cpu(), 0)
    s.cache.clear()
    s.decoder.forward(ids[:start], 0)
    for p in range(start, len(ids)):
        position = torch.tensor([p], device="cuda")
        eager = s.decoder.family(ids[p:p + 1], position,
                                 next(b for b in s.decoder.buckets if b > p)).clone()
        graphed = s.decoder.step(ids[p:p + 1], p)  # rewrites the same K/V at p, then reads
        assert ((graphed - eager).norm() / eager.norm()).item() < 1e-5, p
        there = cpu.decoder.step(ids[p:p + 1].cpu(), p)
        assert ((graphed.cpu() - there).norm() / there.norm()).item() < 1e-3, p
    s.cache.clear()
    run = concurrent_equals_alone(s, n=6)
    assert max(run.engine.batch.rows_seen) >= 3
