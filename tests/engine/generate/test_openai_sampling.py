"""OpenAI's sampling options through both generation loops (fp32 on the CPU): logprobs are the
log_softmax of the model's own logits at each step (transformers' forward, computed apart),
presence and frequency penalties follow OpenAI's formula over the generated tokens, logit_bias
forces and forbids tokens, a bad token id is bad input, and rows with different options in one
batch give, token for token and logprob for logprob, what each gives alone."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.events import Failed, GenerateRequest, LoadRequest, SamplingParams, Token
from engine.generate.session import Session
from tests.engine.generate.test_batch_run import Run

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def llama(tiny_models, one_thread):
    path = tiny_models["llama"]
    session = Session.load(LoadRequest(str(path), device="cpu"))
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return session, reference


def ask(max_new_tokens: int = 10, **sampling) -> GenerateRequest:
    return GenerateRequest(prompt=PROMPT, raw=True, max_new_tokens=max_new_tokens,
                           ignore_eos=True, sampling=SamplingParams(**sampling))


def tokens_of(events) -> list[Token]:
    events = list(events)
    assert not any(isinstance(e, Failed) for e in events), events
    return [e for e in events if isinstance(e, Token) and e.token_ids]


def reference_logits(session: Session, reference, answer: list[int]) -> torch.Tensor:
    """transformers' logits for each answer token's step: [len(answer), V]."""
    prompt = list(session.lm.tokenizer(PROMPT)["input_ids"])
    with torch.no_grad():
        logits = reference(torch.tensor([prompt + answer])).logits[0].float()
    return logits[len(prompt) - 1:len(prompt) - 1 + len(answer)]


@pytest.mark.parametrize("sampling", [
    dict(temperature=0.0, logprobs=5),
    # the penalties, the bias and the temperature change the draw, never the logprobs reported
    dict(temperature=0.8, top_k=20, seed=7, frequency_penalty=0.7, presence_penalty=0.5,
         logit_bias=((11, 3.0),), logprobs=3),
], ids=["greedy", "sampled"])
def test_logprobs_are_the_log_softmax_of_the_models_logits(llama, sampling):
    session, reference = llama
    events = tokens_of(session.generate(ask(**sampling)))
    answer = [t for e in events for t in e.token_ids]
    reported = [lp for e in events for lp in e.logprobs]
    assert len(reported) == len(answer) == 10
    expected = reference_logits(session, reference, answer).log_softmax(-1)
    k = sampling["logprobs"]
    for step, (token, (logprob, top)) in enumerate(zip(answer, reported, strict=True)):
        assert logprob == pytest.approx(expected[step, token].item(), abs=1e-4), step
        want = expected[step].topk(k)
        assert [t for t, _ in top] == want.indices.tolist(), step
        assert [v for _, v in top] == pytest.approx(want.values.tolist(), abs=1e-4), step
    if sampling["temperature"] == 0:  # greedy: the chosen token is the likeliest
        assert all(top[0][0] == t for t, (_, top) in zip(answer, reported, strict=True))


def test_penalties_follow_openais_formula_over_the_generated_tokens(llama):
    """Greedy with both penalties against the formula applied to transformers' logits, step by
    step: logit[j] - count[j] * frequency - (count[j] > 0) * presence, where only generated
    tokens count."""
    session, reference = llama
    frequency, presence = -2.0, -1.5  # a tiny random model seldom repeats: these make it
    got = [t for e in tokens_of(session.generate(ask(
        12, temperature=0.0, frequency_penalty=frequency, presence_penalty=presence)))
        for t in e.token_ids]
    plain = [t for e in tokens_of(session.generate(ask(12, temperature=0.0)))
             for t in e.token_ids]
    answer: list[int] = []
    for _ in range(12):
        logits = reference_logits(session, reference, answer + [0])[-1]  # the next step's
        counts = torch.bincount(torch.tensor(answer, dtype=torch.long),
                                minlength=logits.numel()).float()
        logits = logits - counts * frequency - (counts > 0).float() * presence
        answer.append(int(logits.argmax()))
    assert got == answer
    assert got != plain  # the penalties changed this answer: the check above has teeth


def test_logit_bias_forces_and_forbids_tokens(llama):
    session, _ = llama
    for sampling in (dict(temperature=0.0), dict(temperature=1.0, seed=3)):
        forced = tokens_of(session.generate(ask(**sampling, logit_bias=((42, 100.0),))))
        assert [t for e in forced for t in e.token_ids] == [42] * 10
        plain = [t for e in tokens_of(session.generate(ask(**sampling))) for t in e.token_ids]
        banned = tuple((t, -100.0) for t in set(plain))
        other = [t for e in tokens_of(session.generate(ask(**sampling, logit_bias=banned)))
                 for t in e.token_ids]
        assert not set(other) & set(plain)


def test_a_logit_bias_past_the_vocabulary_is_bad_input(llama):
    session, _ = llama
    vocab = session.lm.model.config.vocab_size
    (end,) = session.generate(ask(temperature=0.0, logit_bias=((vocab, 1.0),)))
    assert isinstance(end, Failed) and end.bad_input and "logit_bias" in end.error


@pytest.mark.parametrize("sampling, words", [
    (dict(presence_penalty=2.5), "presence penalty"),
    (dict(frequency_penalty=float("nan")), "frequency penalty"),
    (dict(logit_bias=((3, 100.5),)), "logit_bias"),
    (dict(logit_bias=((-1, 1.0),)), "logit_bias"),
    (dict(logit_bias=tuple((i, 1.0) for i in range(301))), "at most 300"),
    (dict(logprobs=21), "logprobs"),
])
def test_options_out_of_range_are_bad_input(llama, sampling, words):
    session, _ = llama
    (end,) = session.generate(ask(**sampling))
    assert isinstance(end, Failed) and end.bad_input and words in end.error


ROWS = [dict(temperature=0.0, logprobs=2),
        dict(temperature=0.9, seed=11, frequency_penalty=1.0, logprobs=0),
        dict(temperature=0.7, top_p=0.9, seed=12, presence_penalty=-0.5,
             logit_bias=((5, 4.0), (9, -100.0))),
        dict(temperature=0.0, frequency_penalty=2.0, presence_penalty=2.0),
        dict(temperature=0.0),
        dict(temperature=1.0, seed=13)]


def test_rows_with_different_options_give_in_a_batch_what_each_gives_alone(llama):
    session, _ = llama
    reqs = [ask(8 + 2 * i, **r) for i, r in enumerate(ROWS)]
    alone = [tokens_of(session.generate(r)) for r in reqs]
    run = Run(session)
    try:
        for i, r in enumerate(reqs):
            run.submit(f"r{i}", r)
        for i, expected in enumerate(alone):
            run.wait(f"r{i}")
            got = tokens_of(run.events[f"r{i}"])
            assert [t for e in got for t in e.token_ids] == \
                [t for e in expected for t in e.token_ids], i
            if ROWS[i].get("logprobs") is None:
                assert all(e.logprobs is None for e in got)
                continue
            for g, e in zip(got, expected, strict=True):
                (lp_g, top_g), (lp_e, top_e) = g.logprobs[0], e.logprobs[0]
                assert lp_g == pytest.approx(lp_e, abs=1e-4)
                assert [t for t, _ in top_g] == [t for t, _ in top_e]
        assert max(run.engine.batch.rows_seen) >= 4  # they really ran together
    finally:
        run.close()
