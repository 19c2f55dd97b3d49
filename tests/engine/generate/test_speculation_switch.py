"""A draft model's speculation is a batch of one's: such a generation that is left alone in a
batch is taken out and speculates again; one that speculates alone pauses when another request
comes and joins the batch with it (prompt lookup speculates inside the batch instead:
test_speculation_in_batch.py). Either way its greedy tokens are plain greedy's, token for
token (fp32 on CPU), its stats count every token, and the other request is undisturbed."""

from __future__ import annotations

import pytest

from engine.events import LoadRequest, Token
from engine.generate.session import Session
from tests.engine.generate.test_batch_run import Run, alone, request


@pytest.fixture(scope="module")
def llama(tiny_models, one_thread):
    """The tiny llama drafting for itself: every generation on it speculates."""
    path = str(tiny_models["llama"])
    return Session.load(LoadRequest(path, device="cpu", draft=path))


def _order(run: Run) -> list[str]:
    """Request ids in the order their tokens came, one entry per Token event."""
    return [rid for rid, _ in sorted(((rid, i) for rid, events in run.events.items()
                                      for i, e in enumerate(events) if isinstance(e, Token)),
                                     key=lambda p: p[1])]


def test_the_last_one_left_in_a_batch_speculates_again(llama):
    lookup = request(0, max_new_tokens=120)
    other = request(2, max_new_tokens=12)
    plain, other_alone = alone(llama, [request(0, max_new_tokens=120), other])
    run = Run(llama)
    try:
        run.submit("other", other)
        run.wait("other", first_token=True)
        run.submit("lookup", lookup)
        assert run.tokens("other") == other_alone
        end = run.end("lookup")
        assert run.tokens("lookup") == plain
        assert end.stats.speculation == "draft"  # it left the batch and speculated
        assert end.stats.new_tokens == 120
        assert max(run.engine.batch.rows_seen) >= 2  # the two did run in one batch first
        assert not run.engine.batch.has_work
    finally:
        run.close()


def test_a_speculating_generation_joins_the_batch_when_another_comes(llama, monkeypatch):
    lookup = request(0, max_new_tokens=200)
    other = request(1, max_new_tokens=16)  # sampled with its seed: the same tokens in a batch
    plain, other_alone = alone(llama, [request(0, max_new_tokens=200), other])
    joined = []
    from engine.generate.batch_run import BatchRun

    real_add = BatchRun.add

    def add(self, req, sink, cancel=None, resume=None):
        joined.append(resume is not None and len(resume.generated))
        return real_add(self, req, sink, cancel, resume)

    monkeypatch.setattr(BatchRun, "add", add)
    run = Run(llama)
    try:
        run.submit("lookup", lookup)
        run.wait("lookup", first_token=True)
        run.submit("other", other)
        assert run.tokens("other") == other_alone
        assert not run.done["lookup"].is_set() or len(run.tokens("lookup")) == 200
        end = run.end("lookup")
        assert run.tokens("lookup") == plain
        assert end.stats.new_tokens == 200
        assert end.stats.speculation == "draft"  # alone again after the other ended
        carried = [n for n in joined if n]
        assert len(carried) == 1 and 0 < carried[0] < 200  # it paused mid-answer and joined
        assert max(run.engine.batch.rows_seen) >= 2
    finally:
        run.close()
