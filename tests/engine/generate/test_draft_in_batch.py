"""A draft model speculates inside the batch (spec/draft_rows.py, batch/speculative_rows.py):
its rows' proposals are those the draft gives alone (tests/engine/helpers.py DraftModel) whatever
else drafts beside them; a draft row beside plain rows gives its plain greedy tokens (fp32 on
the CPU) and the plain rows theirs; two draft rows at once, and a draft row beside a
prompt-lookup row, each give theirs; a seeded sampled draft row gives the same tokens beside
others as in a batch of its own; a cancelled or preempted draft row gives its draft blocks back.
Every generation, a draft's included, runs in the batch: none runs alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.events import GenerateRequest, LoadRequest, SamplingParams
from engine.generate.generation import checked_prompt
from engine.generate.session import Session
from engine.spec.draft_rows import Ask, DraftRows, DraftSeq
from tests.engine.generate.test_batch_run import Run, alone, request
from tests.engine.generate.test_speculation_in_batch import COPY, submit_beside
from tests.engine.helpers import DraftModel, token_ids

GREEDY = SamplingParams(temperature=0.0)


def exact(session: Session) -> Session:
    """A round every step at a fixed K: the rows under test speculate."""
    session.adaptive = session.switch_off = False
    return session


@pytest.fixture(scope="module")
def qwen(tiny_models, one_thread):
    """The tiny qwen2 with the tiny llama as its draft (same tokenizer, nearly all rejected)."""
    return exact(Session.load(LoadRequest(str(tiny_models["qwen2"]), device="cpu",
                                          draft=str(tiny_models["llama"]),
                                          num_speculative_tokens=3)))


@pytest.fixture(scope="module")
def itself(tiny_models, one_thread):
    """The tiny qwen2 drafting for itself: every proposal accepted."""
    path = str(tiny_models["qwen2"])
    return exact(Session.load(LoadRequest(path, device="cpu", draft=path,
                                          num_speculative_tokens=3)))


def plain(reqs: list[GenerateRequest]) -> list[GenerateRequest]:
    return [replace(r, num_speculative_tokens=0) for r in reqs]


def drafted(i: int, **kw) -> GenerateRequest:
    return request(i, sampling=GREEDY, **kw)


def draft_arena_is_free(session: Session) -> bool:
    blocks = session.draft.cache.blocks
    return blocks.num_available == len(blocks.blocks)


def test_draft_rows_propose_what_the_draft_proposes_alone(qwen):
    """Rounds of two sequences drafting together: a first one (the prompt's catch-up), one after
    a proposal kept and one rejected, one after all kept (two tokens to catch up). Each row's
    proposals are those it gets drafting alone, and those the draft's own plain greedy answer
    to the same tokens gives."""
    draft, vocab = qwen.draft, qwen.lm.model.config.vocab_size
    prompts = [checked_prompt(qwen.lm, GenerateRequest(prompt=p, raw=True, sampling=GREEDY), [])
               for p in ("The quick brown fox", "one two three four five six seven")]

    def rounds(rows: DraftRows, asked: list) -> list[list[list[int]]]:
        """Each prompt's proposals, round by round, its sequence drafting beside the others'
        in `rows`."""
        seqs = [DraftSeq() for _ in asked]
        ids, got = [p.ids + [7] for p in asked], [[] for _ in asked]
        for keep in (1, 3, 0):
            out = rows.propose([Ask(s, i, 3, p.sampler) for s, i, p in
                                zip(seqs, ids, asked, strict=True)])
            for j, s in enumerate(seqs):
                proposals = out[s][0].tolist()
                got[j].append(proposals)
                s.commit(proposals[:keep], 3)
                ids[j] = ids[j] + proposals[:keep] + [11 + keep]
        for s in seqs:
            rows.release(s)
        return got

    # each alone: the draft rows of one that a generation alone drafts with (DraftModel)
    expected = [rounds(DraftModel(draft, vocab).rows, [p])[0] for p in prompts]
    assert rounds(DraftRows(draft, vocab, 4), prompts) == expected
    assert draft_arena_is_free(qwen)
    for j, p in enumerate(prompts):  # each round's proposals: the draft's own greedy answer
        ids = p.ids + [7]
        for keep, proposals in zip((1, 3, 0), expected[j], strict=True):
            ask = GenerateRequest(prompt_ids=ids, max_new_tokens=3, ignore_eos=True,
                                  sampling=GREEDY)
            assert token_ids(list(draft.generate(ask))) == proposals
            ids = ids + proposals[:keep] + [11 + keep]
    draft.cache.release()  # the draft's own answers' blocks, for the tests after this one


def test_a_draft_row_beside_plain_rows_gives_its_plain_greedy_tokens(qwen):
    spec = drafted(0, prompt=COPY, max_new_tokens=40)
    others = plain([request(i, max_new_tokens=30) for i in (1, 2, 3)])  # sampled, greedy, ...
    expected = alone(qwen, plain([spec]) + others)
    run = Run(qwen)
    try:
        submit_beside(run, spec, others)
        assert run.tokens("spec") == expected[0]
        assert [run.tokens(f"p{i}") for i in range(3)] == expected[1:]
        stats = run.end("spec").stats
        assert stats.speculation == "draft"
        assert stats.accepted_draft_tokens < stats.proposed_draft_tokens  # rejections
        assert max(run.engine.batch.rows_seen) >= 2  # plain rows ran together beside it
        assert run.engine.batch.spec.passes  # its verify rows ran in the batch's steps
    finally:
        run.close()
    assert draft_arena_is_free(qwen)


def test_two_draft_rows_together_equal_each_alone(itself, monkeypatch):
    widths = []
    step = DraftRows._step

    def spied(self, seqs, ids, positions):
        widths.append(len(seqs))
        return step(self, seqs, ids, positions)

    monkeypatch.setattr(DraftRows, "_step", spied)
    reqs = [drafted(0, max_new_tokens=30), drafted(2, prompt=COPY, max_new_tokens=26)]
    expected = alone(itself, plain(reqs))
    run = Run(itself)
    try:
        for i, r in enumerate(reqs):
            run.submit(f"d{i}", r)
        assert [run.tokens(f"d{i}") for i in range(2)] == expected
        for i in range(2):
            stats = run.end(f"d{i}").stats
            assert 0 < stats.accepted_draft_tokens == stats.proposed_draft_tokens
        assert run.engine.batch.spec.passes[2] > 0  # verified in one pass together
    finally:
        run.close()
    assert max(widths) == 2  # the draft stepped both rows at once
    assert draft_arena_is_free(itself)


def test_a_draft_row_and_a_prompt_lookup_row_together(qwen):
    reqs = [drafted(0, max_new_tokens=30),
            drafted(2, prompt=COPY + " one two", max_new_tokens=30, prompt_lookup=True)]
    expected = alone(qwen, plain(reqs))
    run = Run(qwen)
    try:
        run.submit("draft", reqs[0])
        run.submit("lookup", reqs[1])
        assert [run.tokens("draft"), run.tokens("lookup")] == expected
        ends = [run.end("draft").stats, run.end("lookup").stats]
        assert [e.speculation for e in ends] == ["draft", "prompt_lookup"]
        assert all(e.proposed_draft_tokens > 0 for e in ends)
    finally:
        run.close()


def test_a_seeded_sampled_draft_row_equals_itself_in_a_batch_of_its_own(qwen):
    sampled = request(1, prompt=COPY, max_new_tokens=30)
    run = Run(qwen)
    try:
        run.submit("first", sampled)
        first = run.tokens("first")
        assert run.end("first").stats.proposed_draft_tokens > 0
        assert run.engine.batch.spec.passes[1] > 0  # its rounds ran in the batch, as one row
        run.submit("p", plain([request(2, max_new_tokens=40)])[0])
        run.wait("p", first_token=True)
        run.submit("second", sampled)
        assert run.tokens("second") == first
        assert run.end("second").stats.proposed_draft_tokens > 0
    finally:
        run.close()


def test_cancelled_and_preempted_draft_rows_give_their_draft_blocks_back(tiny_models,
                                                                       one_thread):
    # a target arena of 8 blocks for 3 requests that need 4-6 each: the newest running
    # sequences give their blocks back (their draft's too) and are recomputed later
    s = exact(Session.load(LoadRequest(str(tiny_models["qwen2"]), device="cpu", context=128,
                                       kv_tokens=16, draft=str(tiny_models["llama"]),
                                       num_speculative_tokens=3)))
    released = []
    release = DraftRows.release

    def spied(self, seq):
        released.append(seq in self.live)
        return release(self, seq)

    prompts = [COPY, COPY[:60], COPY[20:]]
    reqs = [drafted(i, prompt=p, max_new_tokens=40) for i, p in enumerate(prompts)]
    expected = alone(s, plain(reqs))
    run = Run(s)
    try:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(DraftRows, "release", spied)
            for i, r in enumerate(reqs):
                run.submit(f"s{i}", r)
            assert [run.tokens(f"s{i}") for i in range(3)] == expected
        assert run.engine.batch.scheduler.num_preemptions > 0
        assert sum(released) > 3  # the preempted ones' blocks went back before their ends
        assert draft_arena_is_free(s)
        run.submit("long", drafted(0, prompt=COPY, max_new_tokens=100))
        run.wait("long", first_token=True)
        run.engine.cancel("long")
        assert run.end("long").reason in ("cancelled", "max_tokens")
        assert not run.engine.batch.spec.rows
        assert draft_arena_is_free(s)
    finally:
        run.close()
    given = run.tokens("long")[:40]  # what it gave before the cancel: its plain greedy start
    assert given == expected[0][:len(given)]
