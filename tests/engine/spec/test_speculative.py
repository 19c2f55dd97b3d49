"""Speculative decoding is exact: greedy output equals plain greedy token for token (fp32, every
fixture architecture, draft model and prompt lookup), sampled output follows the target's
distribution (the accept rule on synthetic distributions, and one engine round on real models),
and rejected proposals leave no trace in either cache."""

from __future__ import annotations

import pytest
import torch

from engine.cache import kv_arena
from engine.events import GenerateRequest, LoadRequest, SamplingParams
from engine.generate.session import Session
from engine.spec.proposers import PromptLookup
from engine.spec.speculative import accept_greedy, accept_sampled, verify
from engine.step.sampling import ResolvedSampling, Sampler
from tests.engine.helpers import (
    PROMPT,
    DraftModel,
    finished,
    greedy_request,
    text,
    token_ids,
    verify_and_steps,
)
from tests.fixtures.tiny import ARCHITECTURES

# chi-square critical values at p = 0.001, by degrees of freedom: a false alarm in 1,000 runs
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46}
LOOPY_IDS = tuple(range(100, 108)) * 6  # a repetitive prompt: n-gram matches everywhere


def chi_square(counts: torch.Tensor, p: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic of observed counts against probabilities p, over p's support."""
    keep = p > 0
    assert counts[~keep].sum() == 0, "a token the target gives no probability came out"
    expected = p[keep] * counts.sum()
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


def exact(session: Session) -> Session:
    """Speculation with a fixed K and no timing decisions: the tests' runs are reproducible."""
    session.adaptive = session.switch_off = False
    return session


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/engine/conftest.py


@pytest.fixture(scope="module")
def plain_sessions(tiny_models):
    return {arch: Session.load(LoadRequest(str(tiny_models[arch]), device="cpu"))
            for arch in ARCHITECTURES}


# ---------------------------------------------------------------- the accept rule


def test_accept_greedy_takes_the_agreeing_run_then_the_target_token():
    logits = torch.zeros(4, 6)
    logits[torch.arange(4), torch.tensor([2, 5, 1, 3])] = 1.0  # the target's argmax per row
    n, nxt = accept_greedy(logits, torch.tensor([2, 5, 0]))
    assert (int(n), int(nxt)) == (2, 1)
    n, nxt = accept_greedy(logits, torch.tensor([2, 5, 1]))
    assert (int(n), int(nxt)) == (3, 3)  # all accepted: the bonus token from the last row


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft", "prompt_lookup"])
def test_accept_sampled_emits_the_targets_distribution(point_mass):
    g = torch.Generator().manual_seed(0)
    K, V, N = 2, 5, 12000
    p = torch.rand(K + 1, V, generator=g) ** 3
    p[:, 4] = 0.0  # a token the target never emits
    p /= p.sum(-1, keepdim=True)
    q = torch.rand(K, V, generator=g) ** 3  # another distribution, mass on token 4 too
    q /= q.sum(-1, keepdim=True)
    first, second = torch.zeros(V), torch.zeros(V)
    for _ in range(N):
        if point_mass:  # prompt lookup: a fixed guess, q a point mass on it
            proposals = torch.tensor([1, 4])
            qq = torch.nn.functional.one_hot(proposals, V).float()
        else:
            proposals = torch.multinomial(q, 1, generator=g)[:, 0]
            qq = q
        n, nxt = accept_sampled(p, qq, proposals, g)
        emitted = [*proposals[:int(n)].tolist(), int(nxt)]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    for counts, dist in ((first, p[0]), (second, p[1])):
        stat, df = chi_square(counts, dist)
        assert stat < CHI2_999[df], (stat, counts, dist * counts.sum())


# ---------------------------------------------------------------- greedy: token for token


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_with_a_draft_equals_plain_greedy(arch, tiny_models, plain_sessions):
    ref = list(plain_sessions[arch].generate(greedy_request(n=40)))
    # itself as draft (every proposal accepted), and another model (nearly all rejected)
    other = "llama" if arch == "qwen2" else "qwen2"
    for draft, k in ((arch, 4), (other, 2)):
        s = exact(Session.load(LoadRequest(str(tiny_models[arch]), device="cpu",
                                           draft=str(tiny_models[draft]),
                                           num_speculative_tokens=k)))
        events = list(s.generate(greedy_request(n=40)))
        assert token_ids(events) == token_ids(ref), (draft, k)
        assert text(events) == text(ref)
        stats = finished(events).stats
        assert stats.speculation == "draft" and stats.proposed_draft_tokens > 0
        if draft == arch:
            assert stats.accepted_draft_tokens == stats.proposed_draft_tokens


def test_prompt_lookup_equals_plain_greedy_everywhere(plain_sessions):
    accepted = rejected = 0
    for i, (arch, s) in enumerate(plain_sessions.items()):
        s.switch_off = False
        # a repetitive prompt, and text; K 2 or 5
        kw = dict(prompt_ids=LOOPY_IDS) if i % 2 else dict(prompt=(PROMPT + " ") * 3, raw=True)
        greedy = dict(max_new_tokens=48, sampling=SamplingParams(temperature=0.0), **kw)
        ref = token_ids(list(s.generate(GenerateRequest(**greedy))))
        events = list(s.generate(GenerateRequest(**greedy, prompt_lookup=True,
                                                 num_speculative_tokens=2 + 3 * (i // 3))))
        assert token_ids(events) == ref, arch
        st = finished(events).stats
        assert st.speculation == "prompt_lookup"
        accepted += st.accepted_draft_tokens
        rejected += st.proposed_draft_tokens - st.accepted_draft_tokens
    assert accepted > 0 and rejected > 0  # both paths ran


def test_greedy_with_repetition_penalty_and_stop_string_equals_plain(tiny_models):
    path = str(tiny_models["qwen3"])
    plain = Session.load(LoadRequest(path, device="cpu"))
    spec = exact(Session.load(LoadRequest(path, device="cpu", draft=path,
                                          num_speculative_tokens=3)))
    kw = dict(prompt=PROMPT, raw=True, max_new_tokens=40,
              sampling=SamplingParams(temperature=0.0, repetition_penalty=1.3))
    ref = list(plain.generate(GenerateRequest(**kw)))
    assert token_ids(list(spec.generate(GenerateRequest(**kw)))) == token_ids(ref)
    stop = text(ref)[len(text(ref)) // 2:][:3]  # a stop string inside a round's tokens
    a = list(plain.generate(GenerateRequest(**kw, stop=(stop,))))
    b = list(spec.generate(GenerateRequest(**kw, stop=(stop,))))
    assert finished(b).reason == finished(a).reason == "stop_string"
    assert text(b) == text(a)


def test_verify_block_logits_equal_single_steps(tiny_models):
    for arch in ("qwen2", "gemma"):  # the fused block and transformers' modules
        s = Session.load(LoadRequest(str(tiny_models[arch]), device="cpu", context=300))
        block, steps = verify_and_steps(s)
        assert ((block - steps).norm() / steps.norm()).item() < 1e-5
        assert torch.equal(block.argmax(-1), steps.argmax(-1))


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
BF16_TOLERANCE = 2 ** -5  # 8 bf16 units in the last place of a row's largest logit


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_bf16_verify_block_matches_single_steps_teacher_forced(device, tiny_model_bf16):
    """In bf16 a block of K + 1 positions rounds differently from one position at a time: the
    logits agree within bf16 rounding, and so does the argmax wherever the top-2 margin
    exceeds that (on CPU the two happen to agree exactly)."""
    s = Session.load(LoadRequest(str(tiny_model_bf16), device=device, context=300))
    assert s.lm.quant == "bf16" or device == "cuda"
    s.decoder.capture_blocks(range(2, 14))  # on a GPU: the captured blocks are what is checked
    ids = torch.randint(3, 2048, (262,), generator=torch.Generator().manual_seed(5)).to(device)
    s.decoder.forward(ids[:250], 0)
    steps = torch.stack([s.decoder.step(ids[p:p + 1], p).float() for p in range(250, 262)])
    block = s.decoder.verify(ids[250:262], 250).float()
    tol = BF16_TOLERANCE * steps.abs().amax(-1)  # [T]
    assert ((block - steps).abs().amax(-1) <= tol).all()
    top2 = steps.topk(2, dim=-1).values
    clear = top2[:, 0] - top2[:, 1] > 2 * tol
    assert clear.any()
    assert torch.equal(block.argmax(-1)[clear], steps.argmax(-1)[clear])


@CUDA
def test_captured_verify_blocks_equal_eager_blocks_and_greedy_stays_exact(tiny_models):
    """Written without a GPU to run it on: the verify blocks captured as CUDA graphs."""
    path = str(tiny_models["qwen2"])
    s = exact(Session.load(LoadRequest(path, device="cuda", draft=path,
                                       num_speculative_tokens=4)))
    assert s.decoder.mode == "graph" and s.decoder.block_graphs, s.loaded_event().notes
    ids = torch.randint(3, 2048, (40,), device="cuda", generator=None)
    s.decoder.forward(ids[:30], 0)
    graphed = s.decoder.verify(ids[30:35], 30).clone()
    eager = s.decoder.family.block(ids[30:35], torch.arange(30, 35, device="cuda"), 256)
    assert ((graphed - eager).norm() / eager.norm()).item() < 1e-5
    s.cache.crop(0)
    plain = Session.load(LoadRequest(path, device="cuda"))
    assert token_ids(list(s.generate(greedy_request(n=40)))) == token_ids(
        list(plain.generate(greedy_request(n=40))))


# ---------------------------------------------------------------- rollback


def test_rollback_leaves_caches_as_if_nothing_was_rejected(tiny_models, tiny_model_bf16):
    path = str(tiny_models["qwen2"])
    # the bf16 copy of the same weights as draft: mostly accepted, sometimes rejected
    s = exact(Session.load(LoadRequest(path, device="cpu", draft=str(tiny_model_bf16),
                                       num_speculative_tokens=4)))
    events = list(s.generate(greedy_request(n=48)))
    st = finished(events).stats
    assert 0 < st.accepted_draft_tokens < st.proposed_draft_tokens
    prompt = s.prompt_ids(greedy_request())
    committed = prompt + token_ids(events)[:-1]  # the last token was never fed
    # the batch caches the sequence's full blocks by hash: those past the prompt were written
    # by verify rows, rejected proposals included, and later overwritten
    shared = s.cache.blocks.cached_prefix(committed)
    n = len(shared) * s.cache.block_size
    assert n > len(prompt)
    table = torch.tensor(shared, dtype=torch.int32)
    # every cached K/V equals a fresh prefill of the committed tokens
    fresh = Session.load(LoadRequest(path, device="cpu"))
    fresh.decoder.forward(torch.tensor(committed), 0)
    for layer in range(len(s.cache.k)):
        kv, ref = s.cache.layer(layer), fresh.cache.stored(layer, n)  # positions 0..n-1
        mine = [kv_arena.contiguous(x, table, n) for x in (kv.k, kv.v)]
        for a, b in zip(mine, (ref.k, ref.v), strict=True):
            diff = (a - b).abs().max().item()
            assert diff < 1e-4, (layer, diff)
    fresh.cache.clear()
    # a later plain turn from this session equals a fresh session's
    follow = GenerateRequest(prompt_ids=tuple(committed + [7, 8, 9]), max_new_tokens=24,
                             sampling=SamplingParams(temperature=0.0), num_speculative_tokens=0)
    warm = list(s.generate(follow))
    assert finished(warm).stats.cached_prompt_tokens == n  # the blocks above, reused
    assert token_ids(warm) == token_ids(list(fresh.generate(follow)))


# ---------------------------------------------------------------- sampling, end to end


@pytest.mark.parametrize("draft_arch", ["llama", "qwen2_bf16"])
def test_one_round_samples_from_the_target(draft_arch, tiny_models, tiny_model_bf16):
    """The first token a round emits, over many seeds, against the target's exact top-k
    distribution after the pending token."""
    target = Session.load(LoadRequest(str(tiny_models["qwen2"]), device="cpu"))
    draft_path = tiny_model_bf16 if draft_arch == "qwen2_bf16" else tiny_models[draft_arch]
    draft = Session.load(LoadRequest(str(draft_path), device="cpu"))
    ids = target.prompt_ids(greedy_request())
    pending, position = 17, len(ids)
    target.decoder.forward(torch.tensor(ids), 0)
    target.cache.token_ids = list(ids)
    proposer = DraftModel(draft, vocab=2048)
    proposer.start(ids)
    settings = dict(temperature=1.0, top_p=1.0, top_k=4, repetition_penalty=1.0)
    sampler = Sampler(ResolvedSampling(**settings, seed=0), 2048, torch.device("cpu"),
                      torch.tensor(ids))
    p = sampler.filter(target.decoder.forward(torch.tensor([pending]), position)).softmax(-1)
    counts = torch.zeros(2048)
    for seed in range(600):
        sampler.generator.manual_seed(seed)
        proposals, q = proposer.propose(ids + [pending], 3, sampler)
        tokens, accepted, _ = verify(target.decoder, sampler, torch.tensor([pending]), position,
                                     proposals, q)
        counts[tokens[0]] += 1
        draft.cache.crop(len(ids))  # roll the draft back: every trial starts alike
    stat, df = chi_square(counts, p)
    assert stat < CHI2_999[df], (stat, counts[p > 0], p[p > 0] * 600)


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    lookup = PromptLookup(torch.device("cpu"))
    lookup.start([])
    sampler = None
    seq = [5, 6, 7, 8, 9, 1, 5, 6, 7, 3, 4, 5, 6, 7]
    tokens, q = lookup.propose(seq, 3, sampler)  # (5, 6, 7) last seen before: followed by 3 4 5
    assert tokens.tolist() == [3, 4, 5] and q is None
    assert lookup.propose(seq + [42], 3, sampler) == (None, None)  # 42 never occurred
    lookup.start([])
    assert lookup.propose(seq + [9], 4, sampler)[0].tolist() == [1, 5, 6, 7]  # unigram match
    lookup.start([])
    assert lookup.propose([1, 1, 1], 4, sampler)[0].tolist() == [1]  # only what exists


def test_draft_is_fed_target_ids_past_its_embedding_without_error(tiny_models):
    """A target can emit ids in its padding rows (random weights do; Qwen2.5-7B pads to 152,064
    rows, the 0.5B to 151,936): the draft is fed its last row instead, and its cache still
    records the target's ids, so the next catch-up lines up."""
    draft = Session.load(LoadRequest(str(tiny_models["qwen2"]), device="cpu"))
    rows = draft.lm.model.get_input_embeddings().num_embeddings
    proposer = DraftModel(draft, vocab=rows + 64)
    ids = [5, 6, rows + 10, 7, rows + 63, 8]  # past the draft's rows: an IndexError unclamped
    proposer.start(ids)
    sampler = Sampler(ResolvedSampling(temperature=0.0, top_p=1.0, top_k=0,
                                       repetition_penalty=1.0, seed=0), rows + 64,
                      torch.device("cpu"), torch.tensor(ids))
    tokens, _ = proposer.propose(ids + [rows + 1], 3, sampler)
    assert tokens.numel() == 3 and int(tokens.max()) < rows  # padding rows get no probability
    assert proposer.seq.fed == ids + [rows + 1]  # what the draft holds: the target's ids
