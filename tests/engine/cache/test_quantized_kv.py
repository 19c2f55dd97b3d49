"""The quantized KV cache (int8, fp8: fp16 scales per 32 elements of a head per token) and decode
attention over it: quantization error bounds, the split-context algorithm against plain
softmax, decoding through the engine against a full-precision cache, independence from how
tokens are grouped into passes, crop and reuse (multi-turn, speculative rollback), bytes
against the planner, the choice behind --kv-dtype auto, and on a GPU the Triton kernel and
CUDA graphs against the reference."""

from __future__ import annotations

import json

import pytest
import torch

from engine.attention import decode_attention
from engine.cache.kv_cache import KVCache
from engine.config import overrides
from engine.events import GenerateRequest, LoadRequest, SamplingParams
from engine.formats.model_shape import ModelShape
from engine.generate.session import Session
from engine.kernels import attention_backend, kv_quant
from engine.plan.kv_dtype import auto_kv_dtype, choose_kv_dtype
from engine.plan.memory import kv_bytes_per_token
from engine.tools.eval import run_eval
from tests.engine.helpers import (
    PROMPT,
    REPO,
    finished,
    greedy_request,
    text,
    token_ids,
    verify_and_steps,
)
from tests.fixtures.tiny import ARCHITECTURES

QUANTIZED = ["int8", "fp8"]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/engine/conftest.py


def filled_cache(kv_dtype: str, heads: int, dim: int, length: int, seed: int,
                 device="cpu") -> KVCache:
    """A one-layer cache with fresh random K/V at every position (scaled so that both large and
    small vectors occur)."""
    g = torch.Generator().manual_seed(seed)
    cache = KVCache(1, heads, dim, length, kv_dtype, device)
    cache.reserve(length)
    size = torch.rand(1, heads, length, 1, generator=g) * 4 + 0.01
    k = torch.randn(1, heads, length, dim, generator=g) * size
    v = torch.randn(1, heads, length, dim, generator=g) * size
    cache.write(0, torch.arange(length, device=device), k.to(device), v.to(device))
    return cache


# ---------------------------------------------------------------- quantization


@pytest.mark.parametrize("kv", QUANTIZED)
def test_round_trip_error_is_within_the_formats_rounding(kv):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 50, 128, generator=g) * torch.logspace(-3, 3, 50)[:, None]
    x[0, 0, 0] = 0.0  # a zero vector: scale at its floor, values exactly 0
    x[1, :, :, 5] *= 300  # an outlier channel: it sets its own group's step, no other's
    q, scale = kv_quant.quantize(x, kv_quant.STORAGE[kv])
    assert q.dtype == kv_quant.STORAGE[kv] and scale.dtype == torch.float16
    assert scale.shape == (*x.shape[:-1], 4) and (scale > 0).all()  # one per 32 channels
    err = (kv_quant.dequantize(q, scale) - x).abs()
    s = scale.float().repeat_interleave(32, -1)  # each channel's own group's scale
    if kv == "int8":
        # round to nearest: half a step, and a step is the group's amax / 127 (the fp16 scale
        # rounds by <= 2^-11), or the scale's floor for groups under 127 * 2^-14
        assert (err <= 0.5 * s * (1 + 1e-6)).all()
        amax = x.unflatten(-1, (4, 32)).abs().amax(-1).repeat_interleave(32, -1)
        step = torch.clamp(amax / 127, min=kv_quant.SCALE_MIN)
        assert (err <= step / 2 * (1 + 2 ** -10)).all()
        # the outlier's neighbours outside its group round as finely as without it
        assert (err[1, ..., 32:] <= x[1, ..., 32:].abs().amax() / 254 * (1 + 2 ** -10)).all()
    else:
        # e4m3: 3 mantissa bits, so half an ulp is <= 2^-4 |x|; below the normal range (2^-6 s)
        # the step is the smallest subnormal, 2^-9 s, and the error at most half of it
        assert (err <= torch.maximum(2 ** -4 * x.abs(), 2 ** -10 * s) * (1 + 1e-6)).all()
    assert (kv_quant.dequantize(q, scale)[0, 0, 0] == 0).all()


@pytest.mark.parametrize("kv", QUANTIZED)
def test_written_bytes_do_not_depend_on_how_tokens_are_grouped(kv):
    """One token's bytes are a function of its own vector: the same K/V written in one block,
    in uneven chunks or one token at a time give bit-identical values and scales."""
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(2, 1, 2, 40, 16, generator=g)
    caches = [KVCache(1, 2, 16, 64, kv, "cpu") for _ in range(3)]
    for c in caches:
        c.reserve(40)
    caches[0].write(0, torch.arange(40), k, v)
    for lo, hi in ((0, 7), (7, 8), (8, 33), (33, 40)):
        caches[1].write(0, torch.arange(lo, hi), k[:, :, lo:hi], v[:, :, lo:hi])
    for p in reversed(range(40)):  # any order
        caches[2].write(0, torch.tensor([p]), k[:, :, p:p + 1], v[:, :, p:p + 1])
    base = caches[0].stored(0, 40)
    for c in caches[1:]:
        mine = c.stored(0, 40)
        for a, b in ((base.k, mine.k), (base.v, mine.v)):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        assert torch.equal(base.k_scale, mine.k_scale)
        assert torch.equal(base.v_scale, mine.v_scale)


# ---------------------------------------------------------------- the split-context algorithm


def plain_attention(q, cache: KVCache, pos, kv_len, scaling):
    """Softmax attention over the dequantized cache in fp32, KV heads expanded: the oracle."""
    k, v = cache.read(0, kv_len, torch.float32)  # [1, H_kv, kv_len, D]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q.float() @ k.transpose(-1, -2) * scaling  # [1, H, T, kv_len]
    visible = torch.arange(kv_len)[None, :] <= pos[:, None]  # [T, kv_len]
    return (s.masked_fill(~visible, float("-inf")).softmax(-1) @ v)


@pytest.mark.parametrize("kv", ["fp32", *QUANTIZED])
@pytest.mark.parametrize("T, positions", [(1, [299]), (1, [37]), (3, [150, 151, 152]),
                                          (5, [0, 1, 2, 3, 4])])
def test_reference_split_attention_equals_softmax(kv, T, positions):
    # 8 query heads on 2 KV heads (groups of 4); a bucket of 300 keys cut into splits of 64 (the
    # last one short); positions well inside it, so later splits are empty and masked, and the
    # keys past each position hold stale values that must not leak in
    cache = filled_cache(kv, heads=2, dim=32, length=320, seed=2)
    q = torch.randn(1, 8, T, 32, generator=torch.Generator().manual_seed(3))
    pos = torch.tensor(positions)
    out = decode_attention.reference(q, cache.layer(0), pos, 300, 32 ** -0.5, split=64)
    ref = plain_attention(q, cache, pos, 300, 32 ** -0.5)
    assert out.shape == (1, 8, T, 32)
    assert (out - ref).abs().max().item() < 1e-5


def test_split_counts():
    assert decode_attention.num_splits(64, 8, 132) == 1
    assert decode_attention.num_splits(256, 8, 132) == 4  # >= 64 keys a split
    assert decode_attention.num_splits(1024, 8, 132) == 16
    assert decode_attention.num_splits(1024, 8, 132, min_tokens=256) == 4
    for bad in (0, -64, "64"):
        with pytest.raises(ValueError, match="min_split"):
            decode_attention.num_splits(1024, 8, 132, min_tokens=bad)
    assert decode_attention.num_splits(32768, 8, 132) == 33  # two waves of 132 SMs
    assert decode_attention.num_splits(131072, 1, 132) == decode_attention.MAX_SPLITS


# ---------------------------------------------------------------- through the engine


class NoisyCache(KVCache):
    """An fp32 cache that adds Gaussian noise of relative rms `eps` to every vector written:
    the yardstick for a quantization error of the same size."""

    eps = 0.0

    def write(self, layer, positions, k, v):
        def noisy(x):
            rms = x.norm(dim=-1, keepdim=True) / x.shape[-1] ** 0.5
            return x + torch.randn(x.shape, generator=self.generator) * rms * self.eps

        super().write(layer, positions, noisy(k), noisy(v))


def _teacher_forced(session: Session, ids: torch.Tensor, start: int) -> torch.Tensor:
    session.decoder.forward(ids[:start], 0)
    return torch.stack([session.decoder.step(ids[p:p + 1], p).clone()
                        for p in range(start, ids.numel())])


def _relative_rms_error(cache: KVCache, n: int, kv: str) -> float:
    """The quantization error of `kv` on what an fp32 cache holds, relative rms (worst layer)."""
    worst = 0.0
    for x in (t for i in range(len(cache.k)) for t in cache.stored(i, n)[:2]):
        q, s = kv_quant.quantize(x, kv_quant.STORAGE[kv])
        err = kv_quant.dequantize(q, s) - x
        worst = max(worst, (err.pow(2).mean() / x.pow(2).mean()).sqrt().item())
    return worst


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_quantized_decode_costs_what_its_rounding_costs(arch, tiny_models):
    """Teacher-forced decode with int8/fp8 KV against the fp32 cache. The tolerance comes from
    the quantization error itself: the error each format makes on this model's K/V (relative
    rms, ~0.5% int8, ~2.2% fp8) is injected as Gaussian noise into an fp32 cache, and the
    quantized cache must not hurt the logits more than 1.5x that noise does (measured: 0.95 to
    1.15x; a wrong scale, position or mask costs orders more). The tiny random models amplify
    K/V error about 5x into the logits and have near-ties everywhere, so no absolute bound would
    say more; top-1 agreement with the fp32 cache (95-99% int8, 72-90% fp8 here) must be as
    high as the noise's, within two standard errors of the difference over these 104 positions.
    The fused step (static) must compute what transformers' modules (generic) compute: in fp32
    to 1e-5 (only the summation order differs). Through a quantized cache the two agree to 1%
    of what the quantization itself costs (that cost is the yardstick, measured here): the fused
    step projects q/k/v (and gate/up) in one matmul where the modules run three, and a BLAS
    that blocks the sum by the matrix's width (MKL on an AMD EPYC with avx512_bf16) leaves K/V
    a last bit apart, which flips the rounding of a few int8/fp8 codes or a per-token scale:
    1.4e-4 of the logits there (qwen2 int8, 0.4% of its quantization error; a one-ulp jitter of
    K/V costs qwen3 3.5e-5 here), where a wrong scale, position or mask costs 100% or more."""
    path = str(tiny_models[arch])
    ids = torch.randint(3, 2048, (120,), generator=torch.Generator().manual_seed(7))
    ref_session = Session.load(LoadRequest(path, device="cpu", context=256, eager=True))
    ref = _teacher_forced(ref_session, ids, 16)  # [104, V]
    rel = lambda a: (a - ref).norm(dim=-1) / ref.norm(dim=-1)
    apart = lambda a, b: ((a - b).norm() / b.norm()).item()
    static_fp32 = _teacher_forced(Session.load(LoadRequest(path, device="cpu", context=256)),
                                  ids, 16)
    assert apart(static_fp32, ref) < 1e-5  # the fused math, with no rounding in between
    for kv in QUANTIZED:
        generic = _teacher_forced(Session.load(LoadRequest(path, device="cpu", context=256,
                                                           kv_dtype=kv, eager=True)), ids, 16)
        fused = Session.load(LoadRequest(path, device="cpu", context=256, kv_dtype=kv))
        on_the_step = ("llama", "mistral", "qwen2", "qwen3", "phi3")
        assert fused.decoder.mode == ("static" if arch in on_the_step else "generic")
        static = _teacher_forced(fused, ids, 16)
        quantization_cost = apart(generic, ref)  # 1.2-4.2% int8, 6-21% fp8 on these models
        assert apart(static, generic) <= max(1e-5, 0.01 * quantization_cost), kv
        noisy = Session.load(LoadRequest(path, device="cpu", context=256, eager=True))
        c = noisy.cache
        noisy.cache = noisy.decoder.cache = NoisyCache(len(c.k), c.k[0].shape[1],
                                                       c.k[0].shape[3], c.max_len, "fp32", "cpu")
        noisy.cache.eps = _relative_rms_error(ref_session.cache, ids.numel(), kv)
        noisy.cache.generator = torch.Generator().manual_seed(0)
        yardstick = _teacher_forced(noisy, ids, 16)
        assert rel(static).median() <= 1.5 * rel(yardstick).median(), (kv, rel(static).median())
        agree = lambda a: (a.argmax(-1) == ref.argmax(-1)).float().mean().item()
        miss = 1 - agree(yardstick)
        sampling = 2 * (2 * miss * (1 - miss) / ref.shape[0]) ** 0.5  # 2 s.e. of a difference
        assert agree(static) >= agree(yardstick) - max(sampling, 1 / ref.shape[0]), kv


def test_demo_model_top1_agreement_matches_equal_noise():
    """The bundled demo model (trained, so its margins mean something), teacher-forced over two
    1,024-token windows of held-out text in fp32: int8/fp8 against the fp32 cache agree on the
    top-1 token as often as the same-size noise does (within 0.5%), and their KL divergence is
    within 2x the noise's (measured 1.4x: rounding errors are not quite independent). Agreement
    is about 99.5% for int8 and 97.8% for fp8; the issue's 99.5% target is a figure of
    bench/kv_quality.py (docs/benchmark-log.md), not asserted: two windows cannot resolve it."""
    heldout = (REPO / "packaging" / "demo_model" / "heldout.txt").read_text(encoding="utf-8")
    ref_session = Session.load(LoadRequest(None, "fp32", device="cpu"))
    ids = ref_session.lm.tokenizer(heldout[:40000], verbose=False)["input_ids"]
    windows = [torch.tensor(ids[i:i + 1024]) for i in (0, 1024)]

    def logits(s: Session) -> torch.Tensor:  # teacher-forced by one prefill pass per window
        return torch.cat([s.decoder._model(w, 0, keep=0)[:-1] for w in windows]).log_softmax(-1)

    ref = logits(ref_session)
    for kv in QUANTIZED:
        quant = logits(Session.load(LoadRequest(None, "fp32", kv, device="cpu")))
        noisy = Session.load(LoadRequest(None, "fp32", device="cpu"))
        c = noisy.cache
        noisy.cache = noisy.decoder.cache = NoisyCache(len(c.k), c.k[0].shape[1],
                                                       c.k[0].shape[3], c.max_len, "fp32", "cpu")
        noisy.cache.eps = _relative_rms_error_of(ref_session, windows, kv)
        noisy.cache.generator = torch.Generator().manual_seed(0)
        noise = logits(noisy)
        agree = lambda x: (x.argmax(-1) == ref.argmax(-1)).float().mean().item()
        kl = lambda x: (ref.exp() * (ref - x)).sum(-1).mean().item()
        assert agree(quant) >= agree(noise) - 0.005, (kv, agree(quant), agree(noise))
        assert kl(quant) <= 2 * kl(noise), (kv, kl(quant), kl(noise))


def _relative_rms_error_of(session: Session, windows, kv: str) -> float:
    session.cache.crop(0)
    session.decoder._model(windows[0], 0, keep=1)  # the fp32 K/V of the first window
    return _relative_rms_error(session.cache, windows[0].numel(), kv)


@pytest.mark.parametrize("kv", QUANTIZED)
def test_prefill_grouping_leaves_the_same_cache(kv, tiny_models):
    """One prefill pass, chunks, one token at a time, and fused decode steps. Written bytes are a
    function of each token's own K/V (test above; keys rotated row by row, test_key_rotation),
    but the K/V themselves come from GEMMs whose fp32 rounding depends on how many rows they
    hold (~1e-6 here between a 40-row and a 1-row pass): an element that sits on a rounding
    boundary may land one step over. So a layer whose inputs are the same in every grouping
    (the first, and every layer after a run of byte-identical ones) is identical but for at most
    0.1% of its codes, each off by one step at most.
    A layer after one that differs reads a different cache: its inputs differ by what the model
    makes of that step, which is no property of the cache (here fp8, rotated, puts one key code
    of layer 0 a step over, an eighth of the value near a group's top, and 2.4% of layer 1's
    codes move, up to 13 steps where e4m3's steps are fine near zero). Such a layer is held to
    what quantizing costs it: grouping moves its dequantized K and V (relative norm) less than
    the quantized cache differs from the fp32 cache's (measured 0.9% against 7%)."""
    ids = torch.randint(3, 2048, (40,), generator=torch.Generator().manual_seed(1))
    path = str(tiny_models["qwen2"])
    caches = []
    for grouping in ("fp32", "one pass", "chunks", "tokens", "steps"):
        s = Session.load(LoadRequest(path, device="cpu",
                                     kv_dtype="fp32" if grouping == "fp32" else kv))
        d = s.decoder
        if grouping in ("fp32", "one pass"):
            d.forward(ids, 0)
        elif grouping == "chunks":
            for lo in range(0, 40, 7):
                d.forward(ids[lo:lo + 7], lo)
        elif grouping == "tokens":
            for p in range(40):
                d.forward(ids[p:p + 1], p)
        else:
            d.forward(ids[:1], 0)
            for p in range(1, 40):
                d.step(ids[p:p + 1], p)
        caches.append(s.cache)
    exact, base, rotation = caches[0], caches[1], caches[1].key_rotation
    for c in caches[2:]:
        same_inputs = True
        for layer in range(len(base.k)):
            a, b = base.stored(layer, 40), c.stored(layer, 40)
            if same_inputs:
                changed = total = 0
                for x, y in zip(a[:2], b[:2], strict=True):
                    x, y = x.view(torch.uint8), y.view(torch.uint8)
                    # int8 codes and same-sign e4m3 codes are ordered: one step is one code
                    step = (x.to(torch.int16) - y.to(torch.int16)).abs()
                    step = torch.minimum(step, 256 - step) if kv == "int8" else step  # wraps
                    assert step.max() <= 1, layer
                    changed += int((step > 0).sum())
                    total += step.numel()
                assert changed <= total // 1000, (layer, changed)
                for x, y in zip(a[2:4], b[2:4], strict=True):  # one fp16 rounding step at most
                    assert torch.isclose(x.float(), y.float(), rtol=2 ** -10).all(), layer
                same_inputs = changed == 0
                continue
            f = exact.stored(layer, 40)
            for j, want in enumerate((kv_quant.rotate(f.k, rotation), f.v)):
                x, y = (kv_quant.dequantize(s[j], s[2 + j]) for s in (a, b))
                assert (y - x).norm() < (x - want).norm(), (layer, "kv"[j])


# ---------------------------------------------------------------- crop and reuse


@pytest.mark.parametrize("kv", QUANTIZED)
def test_multi_turn_reuse_with_a_quantized_cache(kv, tiny_model):
    session = Session.load(LoadRequest(str(tiny_model), device="cpu", kv_dtype=kv))
    turn1 = [{"role": "user", "content": "What does zipfile do?"}]
    req = GenerateRequest(messages=tuple(turn1), max_new_tokens=12,
                          sampling=SamplingParams(temperature=0.0))
    ids1 = session.prompt_ids(req)
    reply = text(list(session.generate(req)))
    turn2 = (*turn1, {"role": "assistant", "content": reply},
             {"role": "user", "content": "And tarfile?"})
    req2 = GenerateRequest(messages=turn2, max_new_tokens=12,
                           sampling=SamplingParams(temperature=0.0))
    ids2 = session.prompt_ids(req2)  # the reply kept as generated (prompt.Splice)
    assert ids2[:len(ids1)] == ids1
    events = list(session.generate(req2))
    warm = token_ids(events)
    # the first prompt's full blocks are found cached by hash, quantized as they were written
    block = session.cache.block_size
    assert events[-1].stats.cached_prompt_tokens >= len(ids1) // block * block > 0
    session.cache.clear()
    assert warm == token_ids(list(session.generate(GenerateRequest(
        prompt_ids=tuple(ids2), max_new_tokens=12, sampling=SamplingParams(temperature=0.0)))))


@pytest.mark.parametrize("kv", QUANTIZED)
@pytest.mark.parametrize("arch", ["qwen2", "gemma"])  # the fused block; transformers' modules
def test_speculative_decoding_over_a_quantized_cache(kv, arch, tiny_models):
    """Teacher-forced: a verify block's logits equal single steps' (every token is quantized
    before any query reads it, so both read the same bytes); then greedy with a draft and with
    prompt lookup equals plain greedy token for token, over rollbacks."""
    path = str(tiny_models[arch])
    s = Session.load(LoadRequest(path, device="cpu", context=300, kv_dtype=kv))
    block, steps = verify_and_steps(s)
    assert ((block - steps).norm() / steps.norm()).item() < 1e-5
    assert torch.equal(block.argmax(-1), steps.argmax(-1))

    plain = Session.load(LoadRequest(path, device="cpu", kv_dtype=kv))
    ref = token_ids(list(plain.generate(greedy_request(n=40))))
    # itself as draft (in its own 16-bit cache: mostly accepted), and another model (mostly
    # rejected: rollback of the quantized cache)
    rejected = 0
    for draft in (arch, "llama"):
        spec = Session.load(LoadRequest(path, device="cpu", kv_dtype=kv,
                                        draft=str(tiny_models[draft]), num_speculative_tokens=4))
        spec.adaptive = spec.switch_off = False
        events = list(spec.generate(greedy_request(n=40)))
        assert token_ids(events) == ref, draft
        st = finished(events).stats
        rejected += st.proposed_draft_tokens - st.accepted_draft_tokens
    assert rejected > 0
    # repetitive: n-gram matches. Whether greedy repeats any of it is up to the random model:
    # a 4-token cycle gets proposals from every arch and KV dtype here (an 8-token one left
    # qwen2 over fp8 with none in 48 tokens, and nothing to verify)
    greedy = dict(prompt_ids=tuple(range(100, 104)) * 12, max_new_tokens=48,
                  sampling=SamplingParams(temperature=0.0))
    ref = token_ids(list(plain.generate(GenerateRequest(**greedy))))
    plain.switch_off = False
    lookup = list(plain.generate(GenerateRequest(**greedy, prompt_lookup=True,
                                                 num_speculative_tokens=3)))
    assert token_ids(lookup) == ref
    assert finished(lookup).stats.proposed_draft_tokens > 0


def test_reference_setting_reads_a_16_bit_cache_like_sdpa(tiny_model, monkeypatch):
    """HEARTH_DECODE_ATTENTION=reference: the split algorithm instead of SDPA for a 16-bit
    cache too (fp32 here): the same logits but for summation order."""
    ids = torch.randint(3, 2048, (60,), generator=torch.Generator().manual_seed(8))
    sdpa = _teacher_forced(Session.load(LoadRequest(str(tiny_model), device="cpu")), ids, 20)
    monkeypatch.setenv(attention_backend.ENV, "reference")
    s = Session.load(LoadRequest(str(tiny_model), device="cpu"))
    assert s.cache.decode_attention == "reference"
    ref = _teacher_forced(s, ids, 20)
    assert ((ref - sdpa).norm() / sdpa.norm()).item() < 1e-5


def test_a_kernel_that_fails_at_load_falls_back(tiny_model, monkeypatch):
    """Where the Triton kernel cannot run (no shared memory for its tiles, say), the load says
    so and decode reads the cache through the reference instead of failing every step."""
    monkeypatch.setattr(attention_backend, "choose", lambda *args: "triton")

    def broken(*args, **kwargs):
        raise RuntimeError("out of resources")

    monkeypatch.setattr(decode_attention, "kernel", broken)
    s = Session(Session.load(LoadRequest(str(tiny_model), device="cpu")).lm, "int8")
    assert s.cache.decode_attention == "reference"
    assert any("failed here (RuntimeError: out of resources)" in n
               for n in s.loaded_event().notes)


def test_a_kernel_that_computes_something_else_falls_back(tiny_model, monkeypatch):
    """The load check compares the kernel with the reference (one token and a verify block):
    a kernel that answers wrongly here (a GPU or Triton version never tested) is not used."""
    monkeypatch.setattr(attention_backend, "choose", lambda *args: "triton")
    reference = decode_attention.reference
    calls = []

    def shifted(q, kv, pos, kv_len, scaling, launch=None):  # right for T = 1, off by a
        # row for blocks
        calls.append(q.shape[2])
        out = reference(q, kv, pos, kv_len, scaling)
        return out if q.shape[2] == 1 else out.roll(1, dims=2)

    monkeypatch.setattr(decode_attention, "kernel", shifted)
    s = Session(Session.load(LoadRequest(str(tiny_model), device="cpu")).lm, "int8")
    assert calls[-2:] == [1, 5]  # (the first load checked its own cache too)
    assert s.cache.decode_attention == "reference"
    assert any("disagreed with the reference here" in n for n in s.loaded_event().notes)


def test_a_kernel_that_agrees_with_the_reference_is_kept(tiny_model, monkeypatch):
    monkeypatch.setattr(attention_backend, "choose", lambda *args: "triton")
    monkeypatch.setattr(decode_attention, "kernel",
                        lambda q, kv, pos, n, sc, launch=None: decode_attention.reference(
                            q, kv, pos, n, sc))
    lm = Session.load(LoadRequest(str(tiny_model), device="cpu")).lm
    assert decode_attention.check_kernel(Session(lm, "int8").cache, 4, torch.float32) is None


# ---------------------------------------------------------------- bytes and the auto choice


LLAMA_8B = REPO / "bench" / "llama-3.1-8b" / "config.json"


@pytest.mark.parametrize("kv", ["bf16", *QUANTIZED])
def test_cache_bytes_are_what_the_planner_counts(kv):
    shape = ModelShape.from_config(json.loads(LLAMA_8B.read_text()))
    assert shape.head_dim == 128
    cache = KVCache(shape.num_layers, shape.num_kv_heads, shape.head_dim, 16, kv, "cpu")
    # the context's blocks and the scratch block (the planner counts it with the graph pool)
    assert cache.num_bytes == (16 + cache.block_size) * kv_bytes_per_token(shape, kv)
    if kv != "bf16":
        bf16 = KVCache(shape.num_layers, shape.num_kv_heads, shape.head_dim, 16, "bf16", "cpu")
        # (128 + 8) / (2 * 128) = 53.1%: one byte a value plus a 2-byte scale per 32 values
        assert cache.num_bytes / bf16.num_bytes == pytest.approx(136 / 256)
        assert cache.num_bytes <= 0.54 * bf16.num_bytes


def test_auto_kv_dtype_rule():
    for planned in ("bf16", "fp16"):  # a 16-bit cache fits: the model's own dtype
        assert auto_kv_dtype("bf16", planned, (9, 0)) == "bf16"
        assert auto_kv_dtype("fp16", planned, (7, 5)) == "fp16"
    for planned in QUANTIZED:  # tight: fp8 where e4m3 converts in hardware, else int8
        assert auto_kv_dtype("bf16", planned, (8, 9)) == "fp8"
        assert auto_kv_dtype("bf16", planned, (9, 0)) == "fp8"
        assert auto_kv_dtype("bf16", planned, (8, 6)) == "int8"
        assert auto_kv_dtype("fp16", planned, (7, 5)) == "int8"


def test_auto_kv_dtype_follows_the_planner():
    shape = ModelShape.from_config(json.loads(LLAMA_8B.read_text()))
    gib = 2 ** 30
    # 8K tokens of bf16 KV (1 GiB) beside 16 GB of bf16 weights on an 80 GiB card: plentiful
    assert choose_kv_dtype("bf16", shape, "bf16", 8192, 80 * gib, (9, 0))[0] == "bf16"
    # 128K tokens (16 GiB of bf16 KV) beside 5 GiB of NF4 weights on a 16 GiB card: tight
    kv, why = choose_kv_dtype("bf16", shape, "nf4", 131072, 16 * gib, (8, 9))
    assert kv == "fp8" and "tight" in why
    assert choose_kv_dtype("bf16", shape, "nf4", 131072, 16 * gib, (8, 6))[0] == "int8"
    # 64K tokens (8 GiB) fit there in bf16
    assert choose_kv_dtype("bf16", shape, "nf4", 65536, 16 * gib, (8, 9))[0] == "bf16"


def test_auto_on_cpu_is_the_models_dtype_and_the_load_event_says_so(tiny_model,
                                                                     tiny_model_bf16):
    for path, native in ((tiny_model, "fp32"), (tiny_model_bf16, "bf16")):
        s = Session.load(LoadRequest(str(path), device="cpu"))
        assert s.kv_dtype == native and s.cache.kv_dtype == native
    s = Session.load(LoadRequest(str(tiny_model), device="cpu", kv_dtype="int8"))
    event = s.loaded_event()
    assert event.kv_dtype == "int8" and event.kv_cache_bytes == s.cache.num_bytes
    assert any(n.startswith("KV cache: int8") for n in event.notes)
    assert any("decode attention over the int8 KV cache" in n for n in event.notes)


def test_hearth_eval_scores_with_a_quantized_cache(tiny_model, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text((PROMPT + ". ") * 30)
    for kv in QUANTIZED:
        assert run_eval(str(tiny_model), str(text), "auto", kv, True) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["kv_dtype"] == kv and report["perplexity"] > 1


# ---------------------------------------------------------------- GPU: the Triton kernel


TRITON = pytest.mark.skipif(not (torch.cuda.is_available()
                                 and attention_backend.triton_available()),
                            reason="needs a CUDA GPU and Triton (with a host C compiler)")


def skip_fp8_below_89(kv: str) -> None:
    if kv == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 e4m3 in Triton needs compute capability 8.9")


@TRITON
@pytest.mark.parametrize("kv", ["fp32", "bf16", *QUANTIZED])
@pytest.mark.parametrize("H, Hkv, D, T, kv_len, positions", [
    (32, 8, 128, 1, 1024, [1023]), (32, 8, 128, 1, 4096, [777]), (28, 4, 128, 1, 300, [299]),
    (8, 2, 64, 5, 600, [500, 501, 502, 503, 504]), (4, 2, 16, 1, 256, [0])])
def test_triton_kernel_equals_the_reference(kv, H, Hkv, D, T, kv_len, positions):
    from engine.kernels import decode_attention_kernel

    skip_fp8_below_89(kv)
    cache = filled_cache(kv, Hkv, D, kv_len + 64, seed=4, device="cuda")
    dtype = torch.float32 if kv == "fp32" else torch.bfloat16
    q = torch.randn(1, H, T, D, generator=torch.Generator().manual_seed(5)).to("cuda", dtype)
    pos = torch.tensor(positions, device="cuda")
    out = decode_attention_kernel.decode_attention(q, cache.layer(0), pos, kv_len, D ** -0.5)
    ref = decode_attention.reference(q.float(), cache.layer(0), pos, kv_len, D ** -0.5)
    # fp32: IEEE dots, summation order only; 16-bit: the kernel rounds probabilities to bf16
    # for the P V product (as flash attention does), 2^-9 relative
    tol = 1e-5 if kv == "fp32" else 1e-2
    assert ((out.float() - ref).norm() / ref.norm()).item() < tol


SETTINGS = [{"fp16_dots": True}, {"fp16_dots": True, "asm": True}, {"block_m": 64},
            {"block_m": 16, "fp16_dots": True, "asm": True},
            {"chunk": 64}, {"chunk": 32, "block_m": 16, "block_n": 64, "fp16_dots": True,
                            "asm": True}, {"chunk": 0}, {"fp16_dots": False, "asm": False}]


@TRITON
@pytest.mark.parametrize("kv", QUANTIZED)
@pytest.mark.parametrize("cfg", SETTINGS, ids=lambda c: "+".join(c))
@pytest.mark.parametrize("T, kv_len, positions", [(1, 32768, [32767]), (5, 600, [500, 501, 502,
                                                                                503, 504])])
def test_kernel_settings_over_a_quantized_cache_equal_the_reference(kv, cfg, T, kv_len,
                                                                     positions):
    """The kernel's other settings (codes widened to fp16, int8 by bit operations in Triton or
    in PTX; 16-row tiles; the table a chunk at a time): the
    reference's result within the same 1e-2 as the default setting, at the Llama-3.1-8B
    shape."""
    from engine.kernels import decode_attention_kernel

    skip_fp8_below_89(kv)
    cache = filled_cache(kv, 8, 128, kv_len + 64, seed=8, device="cuda")
    q = torch.randn(1, 32, T, 128, generator=torch.Generator().manual_seed(9)).to("cuda",
                                                                                torch.bfloat16)
    pos = torch.tensor(positions, device="cuda")
    out = decode_attention_kernel.decode_attention(q, cache.layer(0), pos, kv_len, 128 ** -0.5,
                                                   cfg)
    ref = decode_attention.reference(q.float(), cache.layer(0), pos, kv_len, 128 ** -0.5)
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2


@TRITON
@pytest.mark.parametrize("kv", ["bf16", *QUANTIZED])
@pytest.mark.parametrize("cfg", [
    dict(chunk=32, block_m=64, block_n=64, num_warps=4, num_stages=3),  # an illegal address
    # before the gather's indices were kept inside the chunk (bf16)
    dict(chunk=64, block_m=16, block_n=128, num_warps=4, num_stages=2),
    dict(chunk=64, block_m=16, block_n=64, num_warps=8, num_stages=3)], ids=str)
@pytest.mark.parametrize("kv_len", [32768, 1500])
def test_chunked_table_reads_under_each_launch_setting(kv, cfg, kv_len):
    """The block table read a chunk at a time, pipelined by Triton: the reference's result,
    with whole chunks and a partial last one, over every cache dtype."""
    from engine.kernels import decode_attention_kernel

    skip_fp8_below_89(kv)
    cache = filled_cache(kv, 8, 128, kv_len + 64, seed=12, device="cuda")
    q = torch.randn(1, 32, 1, 128, generator=torch.Generator().manual_seed(13)).to(
        "cuda", torch.bfloat16)
    pos = torch.tensor([kv_len - 1], device="cuda")
    out = decode_attention_kernel.decode_attention(q, cache.layer(0), pos, kv_len, 128 ** -0.5,
                                                   cfg)
    torch.cuda.synchronize()  # a fault shows here, in this test
    ref = decode_attention.reference(q.float(), cache.layer(0), pos, kv_len, 128 ** -0.5)
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2


@TRITON
@pytest.mark.parametrize("kv", ["bf16", *QUANTIZED])
@pytest.mark.parametrize("cfg", [{}, {"block_m": 64}, {"block_m": 16, "fp16_dots": True,
                                                       "asm": True}, {"chunk": 0},
                                 {"chunk": 64}, {"chunk": 32, "block_m": 16}], ids=str)
def test_a_verify_blocks_rows_are_the_bits_of_single_steps(kv, cfg):
    """On the tensor cores, under the default "consistent" setting: each row of a five-token
    verify block (20 rows: two 16-row tiles or one 64-row tile) gives the very bits of a
    one-token step at its position, so a draft that agrees with plain decoding is accepted."""
    from engine.kernels import decode_attention_kernel

    skip_fp8_below_89(kv)
    cache = filled_cache(kv, 8, 128, 5000, seed=10, device="cuda")
    q = torch.randn(1, 32, 5, 128, generator=torch.Generator().manual_seed(11)).to(
        "cuda", torch.bfloat16)
    pos = torch.arange(4090, 4095, device="cuda")
    block = decode_attention_kernel.decode_attention(q, cache.layer(0), pos, 4096, 128 ** -0.5,
                                                     cfg)
    for t in range(5):
        single = decode_attention_kernel.decode_attention(q[:, :, t:t + 1], cache.layer(0),
                                                          pos[t:t + 1], 4096, 128 ** -0.5, cfg)
        assert torch.equal(single[:, :, 0], block[:, :, t]), t


@TRITON
def test_compiled_kernels_do_not_grow_with_query_length():
    """Steps and verify blocks of any length and context share one compiled kernel, prefill
    chunks one more (their own row tile): each new length compiled it again before (0.6-0.7 s
    on a GPU, paid by a draft catching up over a plain stretch of a new length)."""
    from engine.kernels import decode_attention_kernel as kernel

    H, Hkv, D = 8, 2, 64
    cache = filled_cache("int8", Hkv, D, 1100, seed=6, device="cuda")
    g = torch.Generator().manual_seed(7)

    def compiled() -> int:
        return sum(len(c[0]) for c in kernel.partial_softmax.device_caches.values())

    def run(T: int, end: int, kv_len: int) -> None:
        q = torch.randn(1, H, T, D, generator=g).to("cuda", torch.bfloat16)
        pos = torch.arange(end - T, end, device="cuda")
        out = kernel.decode_attention(q, cache.layer(0), pos, kv_len, D ** -0.5)
        ref = decode_attention.reference(q.float(), cache.layer(0), pos, kv_len, D ** -0.5)
        assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2, (T, end, kv_len)

    run(1, 600, 1024)
    run(37, 337, 337)
    first = compiled()
    for T, end, kv_len in ((3, 600, 1024), (98, 1000, 1024), (513, 1090, 1090), (1, 17, 64),
                           (17, 300, 1024)):
        run(T, end, kv_len)
    assert compiled() == first


@TRITON
@pytest.mark.parametrize("kv", ["bf16", *QUANTIZED])
def test_graph_decode_over_a_quantized_cache_equals_eager(kv, tiny_model, monkeypatch):
    """The captured steps (quantize-on-write and the Triton kernel inside the graph, positions
    from device tensors) compute what the same step computes eagerly, teacher-forced across
    the 256/512 buckets; with int8/fp8 the generic path, reading the same cache through the same
    kernel, gives the same greedy tokens in fp32 as the graph step built from the same PyTorch
    pieces (the fused pieces round in another order: test_fused_ops.py holds them to the quantized
    cache's measure, and a one-step code flip can turn a near tie on this random model)."""
    skip_fp8_below_89(kv)
    s = Session.load(LoadRequest(str(tiny_model), device="cuda", context=512, kv_dtype=kv))
    assert s.decoder.mode == "graph", s.loaded_event().notes
    assert s.cache.decode_attention == "triton"
    ids = torch.randint(3, 2048, (300,), generator=torch.Generator().manual_seed(6)).cuda()
    s.decoder.forward(ids[:240], 0)
    for p in range(240, 300):
        eager = s.decoder.family(ids[p:p + 1], torch.tensor([p], device="cuda"),
                                 next(b for b in s.decoder.buckets if b > p)).clone()
        graphed = s.decoder.step(ids[p:p + 1], p)  # rewrites the same K/V at p, then reads
        assert ((graphed - eager).norm() / eager.norm()).item() < 1e-5
    if kv == "bf16":
        return
    monkeypatch.setenv(overrides.FUSED_OPS, "off")  # fp32: a short prefill runs the engine's own
    # layer step, the generic path transformers' modules; in bf16 they round apart
    graph = Session.load(LoadRequest(str(tiny_model), device="cuda", context=512, kv_dtype=kv,
                                     quant="fp32"))
    generic = Session.load(LoadRequest(str(tiny_model), device="cuda", context=512,
                                       kv_dtype=kv, eager=True, quant="fp32"))
    assert token_ids(list(generic.generate(greedy_request(n=24)))) == token_ids(
        list(graph.generate(greedy_request(n=24))))


@TRITON
@pytest.mark.parametrize("kv", ["fp32", "int8"])
def test_a_short_prefill_through_the_kernel_equals_the_modules(kv, tiny_model):
    """A chunk of at most SHORT_PREFILL tokens after a cached prefix runs the family step, its
    attention the kernel reading the blocks in place; transformers' modules over a gathered
    copy compute the same logits (fp32: summation order only)."""
    from engine.step.decode import SHORT_PREFILL

    s = Session.load(LoadRequest(str(tiny_model), device="cuda", context=512, quant="fp32",
                                 kv_dtype=kv))
    assert s.decoder.family is not None and s.cache.decode_attention == "triton"
    ids = torch.randint(3, 2048, (300,), generator=torch.Generator().manual_seed(8)).cuda()
    s.decoder.forward(ids[:250], 0)  # the cached prefix (either path)
    T = SHORT_PREFILL - 14
    short = s.decoder.forward(ids[250:250 + T], 250).float().clone()
    modules = s.decoder._model(ids[250:250 + T], 250, keep=1)[-1].float()
    assert ((short - modules).norm() / modules.norm()).item() < 1e-4


def test_16_bit_caches_default_to_sdpa_and_quantized_ones_never_do():
    """Without a GPU, auto reads 16-bit caches through SDPA (over a gathered copy of the blocks)
    and int8/fp8 through the reference; on a GPU with Triton every cache goes through the
    kernel, which reads the paged arena in place (test_graph_decode_... above)."""
    choose = attention_backend.choose
    assert choose("cpu", "bf16", "auto") == "sdpa"
    assert choose("cpu", "int8", "auto") == "reference"  # no GPU: the PyTorch split algorithm
    assert choose("cpu", "fp8", "sdpa") == "reference"
    assert choose("cpu", "bf16", "triton") == "sdpa"  # no Triton on a CPU: SDPA still
    with pytest.raises(ValueError):
        choose("cpu", "bf16", "fast")
