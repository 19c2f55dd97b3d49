"""Sampling seeds, cancel, stop strings, eos lists, chat templates and multi-turn reuse."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest

from engine.events import GenerateRequest, LoadRequest, SamplingParams, Token
from engine.generate.session import Session
from tests.engine.helpers import PROMPT, finished, greedy_request, text, token_ids


@pytest.fixture(scope="module")
def session(tiny_model):
    return Session.load(LoadRequest(str(tiny_model), device="cpu"))


def sampled(session, seed, n=32):
    req = GenerateRequest(prompt=PROMPT, raw=True, max_new_tokens=n,
                          sampling=SamplingParams(temperature=1.0, top_p=0.9, top_k=50,
                                                  seed=seed))
    return token_ids(list(session.generate(req)))


def test_same_seed_same_tokens_different_seed_differs(session):
    a, b, c = sampled(session, 1), sampled(session, 1), sampled(session, 2)
    assert a == b
    assert a != c


def test_cancel_stops_within_one_step(session):
    cancel = threading.Event()
    events = []
    for event in session.generate(greedy_request(n=500), cancel):
        events.append(event)
        if isinstance(event, Token) and len(token_ids(events)) == 3:
            cancel.set()
    fin = finished(events)
    assert fin.reason == "cancelled"
    assert len(token_ids(events)) == 3
    assert fin.stats.new_tokens == 3


def test_stop_string_spanning_two_tokens_cuts_exactly(session):
    full = list(session.generate(greedy_request(n=48)))
    pieces = [e.text for e in full if isinstance(e, Token)]
    # a stop string made of the end of one token's text and the start of the next one's
    k = next(i for i in range(4, len(pieces) - 1)
             if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2)
    stop = pieces[k][-2:] + pieces[k + 1][:2]
    whole = "".join(pieces)
    events = list(session.generate(greedy_request(n=48, stop=(stop,))))
    assert finished(events).reason == "stop_string"
    assert text(events) == whole[: whole.find(stop)]
    assert stop not in text(events)


def test_eos_list_from_generation_config_ends_generation(tiny_model, tmp_path):
    base = Session.load(LoadRequest(str(tiny_model), device="cpu"))
    ids = token_ids(list(base.generate(greedy_request(n=24))))
    target = ids[10]
    first = ids.index(target)  # generation must stop at the first time it appears
    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    gen = json.loads((folder / "generation_config.json").read_text())
    gen["eos_token_id"] = [*gen["eos_token_id"], target]
    (folder / "generation_config.json").write_text(json.dumps(gen))
    events = list(Session.load(LoadRequest(str(folder), device="cpu")).generate(
        greedy_request(n=24)))
    assert finished(events).reason == "eos"
    assert token_ids(events) == ids[: first + 1]


def test_chat_template_and_multi_turn_reuse(session):
    turn1 = [{"role": "user", "content": "What does zipfile do?"}]
    req = GenerateRequest(messages=tuple(turn1), system="Be brief.", max_new_tokens=12,
                          sampling=SamplingParams(temperature=0.0))
    ids1 = session.prompt_ids(req)
    rendered = session.lm.tokenizer.decode(ids1)
    assert rendered.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    assert rendered.endswith("<|im_start|>assistant\n")
    events = list(session.generate(req))
    reply = text(events)
    turn2 = (*turn1, {"role": "assistant", "content": reply},
             {"role": "user", "content": "And tarfile?"})
    req2 = GenerateRequest(messages=turn2, system="Be brief.", max_new_tokens=12,
                           sampling=SamplingParams(temperature=0.0))
    ids2 = session.prompt_ids(req2)
    assert ids2[:len(ids1)] == ids1
    events2 = list(session.generate(req2))
    warm = token_ids(events2)
    # every full block of the first prompt is found cached by hash: only the rest is computed
    block = session.cache.block_size
    assert finished(events2).stats.cached_prompt_tokens >= len(ids1) // block * block > 0
    session.cache.clear()  # the same ids from an empty cache must give the same tokens
    cold = token_ids(list(session.generate(GenerateRequest(
        prompt_ids=tuple(ids2), max_new_tokens=12, sampling=SamplingParams(temperature=0.0)))))
    assert warm == cold


def test_prompt_longer_than_context_fails_cleanly(tiny_model):
    s = Session.load(LoadRequest(str(tiny_model), device="cpu", context=32))
    events = list(s.generate(greedy_request(prompt=PROMPT * 20)))
    assert len(events) == 1 and events[0].name == "failed" and events[0].bad_input
    assert "context" in events[0].error


def test_generate_is_a_batch_of_one_through_the_batch_loop(session):
    session.cache.clear()
    events = list(session.generate(greedy_request(n=6, ignore_eos=True)))
    batch = session.own_batch()
    assert finished(events).reason == "max_tokens" and len(token_ids(events)) == 6
    # its prefill, then its decode steps: one row each, in the session's own BatchRun
    assert batch.prefill_passes[1] >= 1 and batch.rows_seen[1] >= 5 and not batch.has_work


def test_a_stream_left_unread_ends_and_the_next_answers_alone(session):
    req = greedy_request(n=12, ignore_eos=True)
    session.cache.clear()
    whole = token_ids(list(session.generate(req)))
    stream = session.generate(req)
    first = []
    while len(token_ids(first)) < 3:
        first.append(next(stream))
    stream.close()  # the caller went away mid-answer: the request is cancelled, not left running
    assert token_ids(first) == whole[:3] and not session.own_batch().has_work
    session.cache.clear()
    assert token_ids(list(session.generate(req))) == whole


def test_time_to_first_token_leaves_out_the_next_step(session, monkeypatch):
    """On the CPU the first token is computed when its prefill's step ends: its ttft does not
    wait for the decode step that runs before it is given out. A clock that moves on only in
    a decode step tells them apart, however busy the machine."""
    now = [1.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    session.cache.clear()
    batch = session.own_batch()
    decode = batch.batched.decode

    def slow_decode(*args):
        now[0] += 0.5
        return decode(*args)

    monkeypatch.setattr(batch.batched, "decode", slow_decode)
    stats = finished(list(session.generate(greedy_request(n=4, ignore_eos=True)))).stats
    assert stats.ttft_ms < 500 and stats.new_tokens == 4
    assert stats.decode_tokens_per_s == 2.0  # three tokens in three steps of 0.5 s
