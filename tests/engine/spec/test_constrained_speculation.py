"""Speculation for constrained and logprobs requests (spec/constrained_verify.py): a drafted block
is cut at its first token the grammar forbids, each verified position is masked by the grammar
after the drafted prefix before it, and the matcher is rolled back to the accepted length; so
speculative greedy decoding under a grammar equals plain constrained greedy token for token
(draft model and prompt lookup), a sampled round draws from the masked target's distribution,
the matcher after a rejected block equals a fresh one fed the accepted tokens (across a
batch's preemption too), and the logprobs a verify pass reports equal those of
plain one-token steps."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from engine.events import Finished, GenerateRequest, GrammarSpec, LoadRequest, SamplingParams, Token
from engine.generate.session import Session
from engine.grammar.matcher import GrammarState
from engine.spec.constrained_verify import DraftedGrammar
from engine.spec.speculative import verify
from engine.step.sampling import ResolvedSampling, Sampler
from tests.engine.generate.test_batch_run import Run, alone
from tests.engine.generate.test_constrained import SCHEMAS, valid
from tests.engine.helpers import DraftModel, finished, token_ids
from tests.engine.spec.test_speculative import CHI2_999, chi_square

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/engine/conftest.py

CPU = torch.device("cpu")
REGEX = "[0-9]{2}-[a-z]{2}"
# compact JSON like the answers': prompt lookup finds n-grams to propose
SHOWN = '{"color":"red","ok":true} {"color":"blue","ok":false} {"id":5,"tags":["a","b"]} '
GREEDY = SamplingParams(temperature=0.0)
# a logprob from a verify block against one from a single step: fp32 logits of magnitude ~10
# summed over the hidden size in another order differ by ~1e-5 (seen: 2.5e-5)
ROUNDING = 1e-4


def exact(session: Session) -> Session:
    """Speculation every round at a fixed K: the runs are reproducible."""
    session.adaptive = session.switch_off = False
    return session


def request(schema: dict, **kw) -> GenerateRequest:
    return GenerateRequest(**{"prompt": SHOWN, "raw": True, "max_new_tokens": 60,
                              "sampling": GREEDY, "grammar": GrammarSpec.from_schema(schema),
                              **kw})


def logprobs_of(events) -> list:
    return [lp for e in events if isinstance(e, Token) for lp in e.logprobs]


def fed(tok, spec: GrammarSpec, tokens: list[int]) -> GrammarState:
    """A fresh matcher that took `tokens`."""
    state = GrammarState(tok, len(tok), spec, (tok.eos_token_id,))
    for t in tokens:
        state.accept(t)
    return state


def same_state(a: GrammarState, b: GrammarState) -> None:
    assert a.consumed == b.consumed
    assert a.complete_at == b.complete_at and a.stopped == b.stopped
    assert torch.equal(a.allowed(CPU), b.allowed(CPU))  # the next mask


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.fixture(scope="module")
def sessions(tiny_models):
    """The plain qwen2 target, and speculating over it: itself as draft (every proposal
    accepted), llama (many rejected), prompt lookup (K 4)."""
    path = str(tiny_models["qwen2"])

    def load(**kw):
        return exact(Session.load(LoadRequest(path, device="cpu", context=512, **kw)))
    return {"plain": load(), "self": load(draft=path, num_speculative_tokens=4),
            "llama": load(draft=str(tiny_models["llama"]), num_speculative_tokens=3)}


# ---------------------------------------------------------------- the round's grammar


def test_a_drafted_block_is_cut_at_its_first_forbidden_token_and_rolled_back(tok):
    spec = GrammarSpec("regex", REGEX)
    one, two, dash, a, b = (tok.encode(c, add_special_tokens=False)[0] for c in "12-ab")
    grammar = fed(tok, spec, [one])
    round_ = DraftedGrammar(grammar)
    proposals, q = round_.check(torch.tensor([two, dash, dash, a]), None)
    assert proposals.tolist() == [two, dash] and q is None  # a second dash is forbidden
    masks = round_.masks(CPU)  # each verified position under the drafted prefix before it
    for i, prefix in enumerate(([one], [one, two], [one, two, dash])):
        assert torch.equal(masks[i], fed(tok, spec, prefix).allowed(CPU)), i
    round_.settle(1, dash)  # "2" kept, "-" rejected, the target chose "-" there
    same_state(grammar, fed(tok, spec, [one, two, dash]))
    round_ = DraftedGrammar(grammar)  # the next round takes the answer to its end
    proposals, _ = round_.check(torch.tensor([a, b, a]), None)
    assert proposals.tolist() == [a, b] and grammar.stopped  # nothing past a complete answer
    round_.settle(0, b)  # "a" rejected: rolled back from the stopped state
    same_state(grammar, fed(tok, spec, [one, two, dash, b]))


# ---------------------------------------------------------------- greedy: token for token


@pytest.mark.parametrize("how", ["self", "llama", "prompt_lookup"])
def test_constrained_speculation_equals_plain_constrained_greedy(how, sessions):
    spec = sessions["plain" if how == "prompt_lookup" else how]
    accepted = proposed = 0
    for schema in SCHEMAS[:3]:
        ref = list(sessions["plain"].generate(request(schema)))
        events = list(spec.generate(request(schema, prompt_lookup=how == "prompt_lookup")))
        assert token_ids(events) == token_ids(ref), schema
        assert finished(events).reason == finished(ref).reason == "eos"
        text = "".join(e.text for e in events if isinstance(e, Token))
        assert valid(text, schema), text
        stats = finished(events).stats
        accepted += stats.accepted_draft_tokens
        proposed += stats.proposed_draft_tokens
    assert accepted > 0
    assert (accepted == proposed) == (how == "self")  # another draft and lookup are rejected


@pytest.mark.parametrize("how", ["llama", "prompt_lookup"])
def test_after_a_block_rejected_mid_way_the_grammar_is_a_fresh_one_fed_the_answer(
        how, sessions, tok, monkeypatch):
    """Right after the first block rejected mid-way, the matcher equals a fresh one fed the
    tokens kept so far, next mask included, and the answer goes on as plain constrained
    greedy's."""
    seen, settle = [], DraftedGrammar.settle

    def spied(self, accepted, token):
        mid_way = 0 < accepted < self.taken
        settle(self, accepted, token)
        if mid_way and not seen:
            g = self.grammar
            seen.append((g.consumed, g.complete_at, g.stopped, g.allowed(CPU).clone()))
    monkeypatch.setattr(DraftedGrammar, "settle", spied)
    s = sessions["plain" if how == "prompt_lookup" else how]
    req = request(SCHEMAS[1], prompt_lookup=how == "prompt_lookup")
    answer = token_ids(list(s.generate(req)))
    assert answer == token_ids(list(sessions["plain"].generate(request(SCHEMAS[1]))))
    assert seen
    consumed, complete_at, stopped, allowed = seen[0]
    fresh = fed(tok, req.grammar, answer[:consumed])
    assert (fresh.complete_at, fresh.stopped) == (complete_at, stopped)
    assert torch.equal(fresh.allowed(CPU), allowed)


def test_preempted_speculating_constrained_requests_keep_their_grammar(tiny_models, sessions):
    """Speculating requests (a draft attached) in one batch that preempts and recomputes (an
    arena of 8 blocks): every answer equals plain constrained greedy alone."""
    s = exact(Session.load(LoadRequest(str(tiny_models["qwen2"]), device="cpu", context=128,
                                       kv_tokens=16, draft=str(tiny_models["llama"]),
                                       num_speculative_tokens=3)))
    reqs = [request(SCHEMAS[i % 5]) for i in range(6)]
    expected = alone(sessions["plain"], reqs)
    run = Run(s)
    try:
        run.submit("r0", reqs[0])
        run.wait("r0", first_token=True)
        for i, r in enumerate(reqs[1:], 1):
            run.submit(f"r{i}", r)
        got = [run.tokens(f"r{i}") for i in range(len(reqs))]
        ends = [run.end(f"r{i}") for i in range(len(reqs))]
    finally:
        run.close()
    assert run.engine.batch.scheduler.num_preemptions > 0
    assert got == expected
    assert all(isinstance(e, Finished) and e.reason == "eos" for e in ends)
    assert sum(e.stats.proposed_draft_tokens for e in ends) > 0


# ---------------------------------------------------------------- logprobs


@pytest.mark.parametrize("how,schema", [("self", None), ("llama", SCHEMAS[1]),
                                         ("prompt_lookup", SCHEMAS[1])],
                         ids=["self-free", "draft-json", "lookup-json"])
def test_speculative_logprobs_equal_plain_steps(how, schema, sessions):
    """Greedy, with and without a grammar: the same tokens, and each token's logprob and top
    logprobs those of the plain step at its position (the verify pass's row of the same
    logits, equal within fp32 rounding of a block against single steps)."""
    s = sessions["plain" if how == "prompt_lookup" else how]
    kw = dict(prompt=SHOWN, raw=True, max_new_tokens=40,
              grammar=None if schema is None else GrammarSpec.from_schema(schema),
              sampling=SamplingParams(temperature=0.0, logprobs=3))
    ref = list(sessions["plain"].generate(GenerateRequest(**kw)))
    events = list(s.generate(GenerateRequest(**kw, prompt_lookup=how == "prompt_lookup")))
    assert token_ids(events) == token_ids(ref)
    stats = finished(events).stats
    assert stats.accepted_draft_tokens > 0
    assert (stats.accepted_draft_tokens < stats.proposed_draft_tokens) == (how != "self")
    mine, theirs = logprobs_of(events), logprobs_of(ref)
    assert len(mine) == len(theirs) == len(token_ids(ref))
    for (lp, top), (ref_lp, ref_top) in zip(mine, theirs, strict=True):
        assert [i for i, _ in top] == [i for i, _ in ref_top]
        got = torch.tensor([lp, *(v for _, v in top)])
        want = torch.tensor([ref_lp, *(v for _, v in ref_top)])
        torch.testing.assert_close(got, want, rtol=0, atol=ROUNDING)


def test_sampled_penalised_speculation_reports_the_raw_logprobs_of_each_position(sessions):
    """Sampling with a penalty under a grammar and speculation: each reported logprob is
    log_softmax of the target's raw logits at that token's position (before the mask, penalty,
    temperature and filters, as a plain step reports), checked against single steps fed the
    same answer."""
    s = sessions["llama"]
    req = GenerateRequest(prompt=SHOWN, raw=True, max_new_tokens=30, sampling=SamplingParams(
        temperature=0.9, top_p=0.9, repetition_penalty=1.3, seed=5, logprobs=2),
        grammar=GrammarSpec.from_schema(SCHEMAS[1]))
    events = list(s.generate(req))
    assert finished(events).stats.accepted_draft_tokens > 0
    answer, reported = token_ids(events), logprobs_of(events)
    plain = sessions["plain"]
    prompt = plain.prompt_ids(req)
    plain.cache.crop(0)
    logits = plain.decoder.forward(torch.tensor(prompt), 0)
    for i, (token, (lp, top)) in enumerate(zip(answer, reported, strict=True)):
        ref = logits.float().log_softmax(-1)
        values, ids = ref.topk(2)
        assert [t for t, _ in top] == ids.tolist()
        torch.testing.assert_close(torch.tensor([lp, *(v for _, v in top)]),
                                   torch.cat([ref[token:token + 1], values]), rtol=0,
                                   atol=ROUNDING)
        logits = plain.decoder.step(torch.tensor([token]), len(prompt) + i)
    plain.cache.crop(0)


# ---------------------------------------------------------------- sampling under a grammar

TRIALS = 300  # rounds drawn: a support of 4 tokens, each expected 30 times or more


def test_a_constrained_round_samples_from_the_masked_target(tiny_models, sessions, tok):
    """The first token a round emits, over many seeds, against the target's exact top-k
    distribution under the grammar's mask (the draft drafting under the mask too)."""
    target, draft = sessions["plain"], Session.load(LoadRequest(str(tiny_models["llama"]),
                                                                device="cpu"))
    spec = GrammarSpec("regex", "[a-d]{1,3}[0-9]?")
    ids = target.prompt_ids(request(SCHEMAS[0]))
    pending, position = 17, len(ids)
    target.cache.crop(0)
    target.decoder.forward(torch.tensor(ids), 0)
    proposer = DraftModel(draft, vocab=2048)
    proposer.start(ids)
    sampler = Sampler(ResolvedSampling(temperature=1.0, top_p=1.0, top_k=4,
                                       repetition_penalty=1.0, seed=0), 2048, CPU,
                      torch.tensor(ids))
    masked = target.decoder.forward(torch.tensor([pending]), position).masked_fill(
        ~fed(tok, spec, []).allowed(CPU), float("-inf"))
    p = sampler.filter(masked).softmax(-1)
    counts, rejected = torch.zeros(2048), 0
    for seed in range(TRIALS):
        sampler.generator.manual_seed(seed)
        grammar = DraftedGrammar(fed(tok, spec, []))
        proposals, q = proposer.propose(ids + [pending], 3, sampler, grammar)
        tokens, accepted, _ = verify(target.decoder, sampler, torch.tensor([pending]), position,
                                     proposals, q, grammar.masks(CPU))
        grammar.settle(accepted, tokens[-1])
        if accepted < proposals.numel() and rejected < 20:  # as a fresh one fed the answer
            same_state(grammar.grammar, fed(tok, spec, tokens[:grammar.grammar.complete_at]))
        counts[tokens[0]] += 1
        rejected += accepted < proposals.numel()
        del proposer.seq.fed[len(ids):]  # every trial starts alike
    target.cache.crop(0)
    assert rejected > 0
    stat, df = chi_square(counts, p)
    assert stat < CHI2_999[df], (stat, counts[p > 0], p[p > 0] * TRIALS)
