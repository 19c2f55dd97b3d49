"""Continuous batching, end to end through the service Engine: many requests at once
give, token for token, what each gives alone (fp32 on the CPU, every fixture architecture;
greedy and seeded sampling; staggered starts, different prompt lengths and token limits); a
preempted and recomputed sequence gives the tokens of an uninterrupted run; cancel, eos, stop
strings and bad input end one request and leave the others running; teacher-forced batched
logits equal each row alone's; the reproducible mode's answers do not depend on the batch
(SmolLM2 in bf16)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from engine.cache.block_manager import Sequence
from engine.events import (
    Failed,
    Finished,
    GenerateRequest,
    LoadRequest,
    PrefillProgress,
    SamplingParams,
    Token,
)
from engine.generate.session import Session
from engine.service.engine import Engine
from engine.step.batched import BatchedDecoder
from tests.fixtures.tiny import ARCHITECTURES

PROMPTS = ("The quick brown fox", "A zipfile module explains the", "hello hello world of the",
           "one two three four five six seven eight nine ten eleven twelve thirteen", "x",
           "The model", "Tell me about foxes and dogs and cats and the rest of them", "zip")


def request(i: int, **kw) -> GenerateRequest:
    """Even: greedy; odd: sampled with its own seed. Each its own length and limit."""
    sampling = (SamplingParams(temperature=0.0) if i % 2 == 0 else
                SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=100 + i))
    args = dict(prompt=PROMPTS[i % len(PROMPTS)], raw=True, max_new_tokens=14 + 3 * i,
                ignore_eos=True, sampling=sampling)
    return GenerateRequest(**{**args, **kw})


def alone(session: Session, reqs) -> list[list[int]]:
    return [[t for e in session.generate(r) if isinstance(e, Token) for t in e.token_ids]
            for r in reqs]


class Run:
    """An Engine over `session` on its own thread; requests submitted, their events kept."""

    def __init__(self, session: Session, **kw):
        self.engine = Engine(**kw)
        self.engine.session = session
        self.thread = threading.Thread(target=self.engine.run, daemon=True)
        self.thread.start()
        self.events: dict[str, list] = {}
        self.done: dict[str, threading.Event] = {}

    def submit(self, rid: str, req: GenerateRequest) -> None:
        self.events[rid], self.done[rid] = [], threading.Event()

        def sink(e, rid=rid):
            self.events[rid].append(e)
            if isinstance(e, Finished | Failed):
                self.done[rid].set()
        self.engine.submit(req, sink, request_id=rid)

    def wait(self, rid: str, first_token: bool = False) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.done[rid].is_set() or (first_token and any(
                    isinstance(e, Token) for e in self.events[rid])):
                return
            time.sleep(0.002)
        raise AssertionError(f"{rid} did not get there")

    def tokens(self, rid: str) -> list[int]:
        self.wait(rid)
        return [t for e in self.events[rid] if isinstance(e, Token) for t in e.token_ids]

    def end(self, rid: str):
        self.wait(rid)
        return self.events[rid][-1]

    def close(self) -> None:
        self.engine.stop()
        self.thread.join(30)


def concurrent_equals_alone(session: Session, n: int = 8, **kw) -> Run:
    """n requests, half submitted at once and half once the first has its first token, against
    each alone -> the Run (its engine's batch holds what ran)."""
    reqs = [request(i, **kw) for i in range(n)]
    expected = alone(session, reqs)
    run = Run(session)
    try:
        for i in range(n // 2):
            run.submit(f"r{i}", reqs[i])
        run.wait("r0", first_token=True)
        for i in range(n // 2, n):
            run.submit(f"r{i}", reqs[i])
        got = [run.tokens(f"r{i}") for i in range(n)]
    finally:
        run.close()
    assert got == expected
    return run


@pytest.fixture(scope="module")
def sessions(tiny_models, one_thread):
    return {arch: Session.load(LoadRequest(str(path), device="cpu"))
            for arch, path in tiny_models.items()}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_concurrent_requests_give_what_each_gives_alone(arch, sessions):
    """Every family batches, Gemma through transformers' modules too."""
    s = sessions[arch]
    run = concurrent_equals_alone(s)
    assert max(run.engine.batch.rows_seen) >= 5  # steps of many rows really ran
    assert s.cache.seq.block_ids == [] and s.cache.token_ids == []  # back to its own
    assert not any("one at a time" in n for n in s.loaded_event().notes)


def test_a_step_of_one_row_is_the_sessions_own_step(sessions, monkeypatch):
    s = sessions["llama"]
    calls = []
    monkeypatch.setattr(BatchedDecoder, "step", lambda *a: calls.append(a))
    expected = alone(s, [request(0)])[0]  # first: the engine thread owns the session once it runs
    run = Run(s)
    run.submit("one", request(0))
    assert run.tokens("one") == expected
    run.close()
    assert not calls and set(run.engine.batch.rows_seen) <= {0, 1}


def test_preempted_sequences_are_recomputed_to_the_same_tokens(tiny_models, one_thread):
    """An arena of 12 blocks for 6 requests that need 4-5 each: the newest running sequences
    give their blocks back and are recomputed later; nothing fails."""
    s = Session.load(LoadRequest(str(tiny_models["qwen2"]), device="cpu", context=128,
                                 kv_tokens=16))  # one context's worth at least: 8 blocks
    assert s.cache.num_blocks == 8
    reqs = [request(i, max_new_tokens=40) for i in range(6)]
    expected = alone(s, reqs)
    run = Run(s)
    for i, r in enumerate(reqs):
        run.submit(f"p{i}", r)
    got = [run.tokens(f"p{i}") for i in range(6)]
    run.close()
    assert run.engine.batch.scheduler.num_preemptions > 0
    assert got == expected


def test_one_request_ends_and_the_others_run_on(sessions):
    s = sessions["llama"]
    long, eos = alone(s, [request(2, max_new_tokens=60),
                          request(0, ignore_eos=False, max_new_tokens=200)])
    run = Run(s)  # (the session is the engine thread's from here on)
    try:
        run.submit("long", request(2, max_new_tokens=60))
        run.submit("cancel", request(4, max_new_tokens=200))
        run.submit("bad", request(1, prompt_ids=(10 ** 9,), prompt=None))
        run.submit("eos", request(0, ignore_eos=False, prompt_ids=None, max_new_tokens=200))
        run.wait("cancel", first_token=True)
        run.engine.cancel("cancel")
        assert run.end("cancel").reason == "cancelled"
        bad = run.end("bad")
        assert isinstance(bad, Failed) and bad.bad_input and "vocabulary" in bad.error
        assert run.tokens("long") == long
        assert run.end("eos").reason in ("eos", "max_tokens")
        assert run.tokens("eos") == eos
    finally:
        run.close()


def test_stop_strings_per_request(sessions):
    s = sessions["llama"]
    free = alone(s, [request(0, max_new_tokens=30)])[0]
    text = s.lm.tokenizer.decode(free[5:9])
    stop = text.strip()[:3] or text[:2]
    run = Run(s)
    run.submit("stop", request(0, max_new_tokens=30, stop=(stop,)))
    run.submit("free", request(0, max_new_tokens=30))
    try:
        stopped = run.end("stop")
        shown = "".join(e.text for e in run.events["stop"] if isinstance(e, Token))
        assert stopped.reason == "stop_string" and stop not in shown
        assert run.tokens("free") == free
    finally:
        run.close()


def test_long_prompts_report_prefill_progress(tiny_models, one_thread):
    s = Session.load(LoadRequest(str(tiny_models["llama"]), device="cpu", context=512))
    s.prefill_chunk = 32
    ids = tuple(range(5, 205))
    expected = alone(s, [request(0, prompt_ids=ids, prompt=None, max_new_tokens=4)])[0]
    s.cache.clear()  # nothing of the prompt cached: all of it prefilled, in chunks
    run = Run(s)
    run.submit("long", request(0, prompt_ids=ids, prompt=None, max_new_tokens=4))
    run.submit("short", request(2, max_new_tokens=8))
    try:
        progress = [e for e in (run.end("long") and run.events["long"])
                    if isinstance(e, PrefillProgress)]
        assert progress and progress[-1].done == progress[-1].total == 200
        assert [p.done for p in progress] == sorted(p.done for p in progress)
        assert run.tokens("long") == expected
    finally:
        run.close()


def teacher_forced_rows(session: Session, n_seqs: int = 5, steps: int = 6, seed: int = 0,
                        eager: bool = False):
    """Sequences of different lengths in one arena, prefilled, then `steps` teacher-forced
    positions each: -> (logits of each position alone [n, steps, V], the same positions in
    batched steps [n, steps, V]); `eager`: batched steps without CUDA graphs."""
    cache, dec = session.cache, session.decoder
    device = session.lm.device
    g = torch.Generator().manual_seed(seed)
    vocab = session.lm.model.config.vocab_size
    lengths = [40 + 53 * i for i in range(n_seqs)]
    ids = [torch.randint(3, vocab, (n + steps,), generator=g).to(device) for n in lengths]
    cache.release()
    tables = [Sequence() for _ in lengths]
    single, batched = [], []
    for table, x, n in zip(tables, ids, lengths, strict=True):
        cache.blocks.allocate(table, x[:n].tolist())
        cache.blocks.append(table, n + steps)
        cache.bind(table)
        dec.forward(x[:n], 0)
        single.append(torch.stack([dec.step(x[n + j:n + j + 1], n + j).float().clone()
                                   for j in range(steps)]))
        _scramble(cache, n, steps)  # the batched steps must write these positions themselves
    step = BatchedDecoder(dec, n_seqs)
    step.use_graphs = step.use_graphs and not eager
    for j in range(steps):
        logits = step.step([int(x[n + j]) for x, n in zip(ids, lengths, strict=True)],
                           [n + j for n in lengths],
                           [(i, t) for i, t in enumerate(tables)])
        batched.append(logits.float().clone())
    for table in tables:
        cache.blocks.release(table)
    cache.unbind()
    return torch.stack(single), torch.stack(batched, dim=1)


def _scramble(cache, start: int, steps: int) -> None:
    """Noise over the live sequence's K/V at positions start..start+steps-1, every layer."""
    g = torch.Generator().manual_seed(start)
    pos = torch.arange(start, start + steps, device=cache.device)
    for layer in range(len(cache.k)):
        shape = (1, cache.num_kv_heads, steps, cache.head_dim)
        k, v = (torch.randn(shape, generator=g).to(cache.device) for _ in range(2))
        cache.write(layer, pos, k, v)


def test_teacher_forced_batched_rows_equal_each_row_alone(sessions):
    single, batched = teacher_forced_rows(sessions["qwen3"])
    rel = (batched - single).norm(dim=-1) / single.norm(dim=-1)
    assert rel.max() < 1e-5, rel  # fp32: the linear layers' row order only


@pytest.fixture(scope="module")
def smol(smollm2):
    s = Session.load(LoadRequest(str(smollm2), device="cpu", reproducible=True))
    assert s.config.reproducible
    return s


def test_reproducible_answers_do_not_depend_on_the_batch(smol):
    """The reproducible mode's promise across requests: in bf16, greedy and seeded answers of 6
    concurrent chats are, token for token, each chat's alone; teacher-forced rows bit for bit."""
    single, batched = teacher_forced_rows(smol, n_seqs=4, steps=3)
    assert torch.equal(single, batched)
    concurrent_equals_alone(smol, n=6, max_new_tokens=12)


def test_prompt_lookup_speculates_alone_and_inside_a_batch(sessions):
    """Prompt lookup alone: a batch of one (speculative stats); the same request while others
    run: it joins their batch and speculates there, and the greedy tokens are the same."""
    s = sessions["llama"]
    lookup = request(0, prompt_lookup=True, max_new_tokens=40)
    plain = alone(s, [request(0, max_new_tokens=40)])[0]
    run = Run(s)
    try:
        run.submit("alone", lookup)
        assert run.end("alone").stats.speculation == "prompt_lookup"
        assert run.tokens("alone") == plain
        run.submit("other", request(2, max_new_tokens=80))
        run.wait("other", first_token=True)
        run.submit("joined", lookup)
        assert run.end("joined").stats.speculation == "prompt_lookup"
        assert run.tokens("joined") == plain
        assert max(run.engine.batch.rows_seen) >= 1
    finally:
        run.close()
