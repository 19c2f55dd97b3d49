"""A step's sampled tokens stay on the device while the next step is planned and launched
(batch/inflight.py): the sequences hold a placeholder until then, the batched step reads the
tokens on the device, and the answers are each request's alone (test_batch_run.py's checks run
through the same path)."""

from __future__ import annotations

import pytest
import torch

from engine.batch.inflight import UNKNOWN, InFlight
from engine.batch.sequence import Seq
from engine.events import Finished, Token
from engine.generate.batch_run import BatchRun
from engine.step.batched import BatchedDecoder
from tests.engine.generate.test_batch_run import alone, request, sessions  # noqa: F401


def test_held_tokens_are_found_by_position_and_written_on_resolve():
    a, b = Seq("a", [1, 2, 3], 5, output_ids=[7, UNKNOWN]), Seq("b", [4], 5,
                                                               output_ids=[UNKNOWN])
    held = InFlight()
    assert not held and held.resolve() == {}
    held.hold(torch.tensor([11, 22]), [(a, 0, 1), (b, 1, 0)])
    assert held.index(a, 4) == 0 and held.index(b, 1) == 1
    assert held.index(a, 3) is None  # a's token 7 is on the host already
    with pytest.raises(RuntimeError):
        held.hold(torch.tensor([1]), [(a, 0, 1)])
    assert held.resolve() == {a: 11, b: 22}
    assert a.output_ids == [7, 11] and b.output_ids == [22] and not held


def test_the_next_step_reads_the_last_steps_tokens_on_the_device(sessions, monkeypatch):  # noqa: F811
    session = sessions["llama"]
    reqs = [request(2 * i, max_new_tokens=6) for i in range(3)]  # greedy
    expected = alone(session, reqs)
    seen = []
    step = BatchedDecoder.step

    def spy(self, tokens, positions, tables, on_device=None):
        seen.append(None if on_device is None else list(on_device[1]))
        return step(self, tokens, positions, tables, on_device)

    monkeypatch.setattr(BatchedDecoder, "step", spy)
    events = [[] for _ in reqs]
    batch = BatchRun(session, 4)
    for r, out in zip(reqs, events, strict=True):
        batch.add(r, out.append)
    batch.step()  # the prompts, each sampling its first token
    assert batch.inflight and all(s.output_ids == [UNKNOWN] for s in batch.gens)
    assert not any(isinstance(e, Token) for out in events for e in out)  # not on the host yet
    batch.step()  # three decode rows, their tokens read on the device
    assert seen == [[0, 1, 2]]
    assert any(isinstance(e, Token) for e in events[0])  # the first tokens went out meanwhile
    while batch.has_work:
        batch.step()
    assert all(isinstance(out[-1], Finished) for out in events)
    got = [[t for e in out if isinstance(e, Token) for t in e.token_ids] for out in events]
    assert got == expected


def test_a_step_that_breaks_fails_every_stream_once_and_the_batch_goes_on(sessions,  # noqa: F811
                                                                          monkeypatch):
    """The third batched step raises: the tokens sampled before it still go out (each stream a
    prefix of its answer alone), then one Failed each; the next requests run as if nothing had
    happened."""
    from engine.events import Failed

    session = sessions["llama"]
    reqs = [request(2 * i, max_new_tokens=8) for i in range(3)]
    expected = alone(session, reqs)
    step, calls = BatchedDecoder.step, []

    def breaks(self, *args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the device went away")
        return step(self, *args, **kw)

    monkeypatch.setattr(BatchedDecoder, "step", breaks)
    events = [[] for _ in reqs]
    batch = BatchRun(session, 4)
    for r, out in zip(reqs, events, strict=True):
        batch.add(r, out.append)
    while batch.has_work:
        batch.step()
    assert not batch.inflight
    for out, want in zip(events, expected, strict=True):
        ends = [e for e in out if isinstance(e, Finished | Failed)]
        assert len(ends) == 1 and isinstance(ends[0], Failed) and "went away" in ends[0].error
        got = [t for e in out if isinstance(e, Token) for t in e.token_ids]
        assert 3 <= len(got) < len(want) and got == want[:len(got)]
    again = [[] for _ in reqs]
    for r, out in zip(reqs, again, strict=True):
        batch.add(r, out.append)
    while batch.has_work:
        batch.step()
    assert [[t for e in out if isinstance(e, Token) for t in e.token_ids]
            for out in again] == expected
