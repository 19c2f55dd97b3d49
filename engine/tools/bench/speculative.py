"""`hearth bench --draft PATH | --prompt-lookup [--synthetic-acceptance A]`: speculative decoding
timed against the engine's own plain decode on the same prompts, in the same run.

With `--synthetic-acceptance A` the draft is proposers.SyntheticDraft: the real draft forward
runs for its cost, but it proposes the target's own greedy continuation (the plain run's output)
with a per-token error rate of 1 - A, so the engine's machinery is measured at a controlled
acceptance rate even with random weights. Greedy only, like every bench run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from engine.events import BadRequest, LoadRequest
from engine.generate.session import Session
from engine.spec.controller import expected_speedup
from engine.spec.proposers import SyntheticDraft

SYNTHETIC_K = 4  # the measurement point when --num-speculative-tokens is not given
TIMED_STEPS = 32


@dataclass
class SpecArgs:
    """What `hearth bench` speculates with; all off: no speculative measurement."""

    draft: str | None = None
    prompt_lookup: bool = False
    num_speculative_tokens: int | None = None
    synthetic_acceptance: float | None = None
    prompts_file: str | None = None


@dataclass
class SpeculativeResult:
    speculation: str  # "draft", "prompt_lookup" or "synthetic"
    num_speculative_tokens: int | None  # fixed K; None: adaptive
    decode_tokens_per_s: float  # median of the runs, as the plain figure
    runs_tokens_per_s: list[float]
    plain_decode_tokens_per_s: float  # median of the plain runs paired with them
    speedup: float  # median over prompts of speculative / plain, each pair run back to back
    acceptance_rate: float  # alpha: per proposal, given the ones before it were accepted
    mean_accepted_length: float  # tokens per verify pass
    accepted_draft_tokens: int
    proposed_draft_tokens: int
    identical_to_plain: bool  # the same greedy tokens as the plain runs
    draft_step_ratio: float | None = None  # c: a draft step over a target step, timed here
    expected_speedup: float | None = None  # from alpha, K and c; fixed K only
    synthetic_acceptance: float | None = None
    switch_off_speedup: float | None = None  # synthetic: the same with the switch-off on
    notes: list[str] = field(default_factory=list)


def step_seconds(session: Session, position: int) -> float:
    """Device time of one decode step at `position` (what a round's draft steps cost)."""
    dev = session.lm.device
    token = torch.zeros(1, dtype=torch.long, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else lambda: None
    for _ in range(3):
        session.decoder.step(token, position)
    sync()
    t = time.perf_counter()
    for _ in range(TIMED_STEPS):
        session.decoder.step(token, position)
    sync()
    session.cache.crop(min(len(session.cache.token_ids), position))  # it wrote at position
    return (time.perf_counter() - t) / TIMED_STEPS


def load_draft(target: Session, draft: str, random_weights: bool, req: LoadRequest) -> Session:
    from engine.config import overrides
    from engine.files.model_folder import check
    from engine.files.model_folder import config_only_folder as _folder_for_random
    from engine.load import loader

    dreq = LoadRequest(model=draft, quant="auto", device=target.lm.device.type,
                       context=target.lm.context, eager=req.eager, compile=req.compile)
    if random_weights:
        dlm = loader.random_model(_folder_for_random(draft), dreq, overrides.backends())
    else:
        if target.lm.tokenizer is None:
            raise BadRequest("a real draft needs a real target; add --random-weights to both")
        from transformers import AutoTokenizer

        from engine.spec.proposers import check_same_tokenizer

        folder = check(draft)
        tok = AutoTokenizer.from_pretrained(folder.path, trust_remote_code=False)
        check_same_tokenizer(target.lm.tokenizer, tok, draft)
        dlm = loader.load(folder, dreq, lambda e: None, tokenizer=tok,
                          backends=overrides.backends())
    return Session(dlm, "auto", fast_path=not req.eager, compile_layers=req.compile)


def measure(session: Session, prompts: list[list[int]], plain: list[tuple], run_one,
            draft: Session | None, prompt_lookup: bool, k: int | None,
            synthetic: float | None) -> SpeculativeResult:
    """plain: (Finished, token ids) of the plain runs on prompts[i]; run_one: bench._run_one."""
    if synthetic is not None:
        if draft is None:
            raise BadRequest("--synthetic-acceptance needs --draft (its forward is the cost)")
        if not 0 <= synthetic <= 1:
            raise BadRequest(f"--synthetic-acceptance must be in [0, 1], got {synthetic}")
        k = k or SYNTHETIC_K
    # the machinery itself with a synthetic draft, at any acceptance: no switch-off
    session.configure_speculation(num_speculative_tokens=k, switch_off=synthetic is None)
    if draft is not None:
        proposer = None
        if synthetic is not None:
            vocab = session.lm.model.config.vocab_size
            proposer = SyntheticDraft(vocab, session.lm.device, synthetic, seed=0)
        session.attach_draft(draft, proposer)

    def spec_run(i: int):
        if session.synthetic is not None:
            session.synthetic.reference = prompts[i] + plain[i][1]
            # each prompt's run draws the same errors with the switch-off as without it: with one
            # stream through all runs, the two saw different luck, not the switch-off's effect
            session.synthetic.rng.seed(i)
        return run_one(session, prompts[i], len(plain[i][1]), prompt_lookup=prompt_lookup)

    def plain_run(i: int) -> float:
        fin, _ = run_one(session, prompts[i], len(plain[i][1]), num_speculative_tokens=0)
        return fin.stats.decode_tokens_per_s

    spec_run(0)  # warm-up: first uses of each block size, graph capture
    # each speculative run right after a plain run of the same prompt: the speedup is the
    # median of the pairs' ratios, so a machine that slows down (a shared CPU) biases neither
    runs, paired = [], []
    for i in range(len(plain)):
        paired.append(plain_run(i))
        runs.append(spec_run(i))
    stats = [fin.stats for fin, _ in runs]
    decode = statistics.median(s.decode_tokens_per_s for s in stats)
    ratios = [s.decode_tokens_per_s / p for s, p in zip(stats, paired, strict=True)]
    accepted = sum(s.accepted_draft_tokens for s in stats)
    tested = sum(s.accepted_draft_tokens / s.acceptance_rate for s in stats if s.acceptance_rate)
    rounds = sum(s.accepted_draft_tokens / (s.mean_accepted_length - 1) for s in stats
                 if s.mean_accepted_length > 1)
    alpha = accepted / tested if tested else 0.0
    result = SpeculativeResult(
        speculation=stats[0].speculation, num_speculative_tokens=k,
        decode_tokens_per_s=decode, runs_tokens_per_s=[s.decode_tokens_per_s for s in stats],
        plain_decode_tokens_per_s=statistics.median(paired),
        speedup=round(statistics.median(ratios), 3), acceptance_rate=round(alpha, 4),
        mean_accepted_length=round(1 + accepted / rounds, 3) if rounds else 1.0,
        accepted_draft_tokens=accepted,
        proposed_draft_tokens=sum(s.proposed_draft_tokens for s in stats),
        identical_to_plain=all(ids == p[1] for (_, ids), p in zip(runs, plain, strict=True)),
        synthetic_acceptance=synthetic)
    if draft is not None:
        position = len(prompts[0])
        result.draft_step_ratio = round(step_seconds(draft, position)
                                        / step_seconds(session, position), 4)
    elif prompt_lookup:
        result.draft_step_ratio = 0.0
    if k is not None and result.draft_step_ratio is not None:
        result.expected_speedup = round(expected_speedup(alpha, k, result.draft_step_ratio), 3)
    if synthetic is not None:
        session.configure_speculation(switch_off=True)  # a fresh controller: it probes
        # plain steps first
        with_off = [spec_run(i)[0].stats.decode_tokens_per_s / plain_run(i)
                    for i in range(len(plain))]
        result.switch_off_speedup = round(statistics.median(with_off), 3)
        result.notes.append("speculation ran with the switch-off disabled; "
                            "switch_off_speedup is the same with it enabled")
    if stats[-1].speculation_switched_off:
        result.notes.append("the switch-off was in force at the end of the last run")
    return result


def markdown_rows(r: SpeculativeResult) -> list[tuple[str, str]]:
    k = "adaptive" if r.num_speculative_tokens is None else str(r.num_speculative_tokens)
    rows = [
        ("speculation", f"{r.speculation.replace('_', ' ')}, K {k}"
                        + (f", synthetic acceptance {r.synthetic_acceptance}"
                           if r.synthetic_acceptance is not None else "")),
        ("speculative decode (median)", f"{r.decode_tokens_per_s:,.1f} tokens/s against "
                                        f"{r.plain_decode_tokens_per_s:,.1f} plain; "
                                        f"{r.speedup}x (median of paired runs)"),
        ("acceptance", f"alpha {r.acceptance_rate}, {r.accepted_draft_tokens} of "
                       f"{r.proposed_draft_tokens} proposals, mean accepted length "
                       f"{r.mean_accepted_length}"),
        ("same tokens as plain greedy", "yes" if r.identical_to_plain else "no"),
    ]
    if r.draft_step_ratio is not None:
        expected = f"; expected speedup {r.expected_speedup}x" if r.expected_speedup else ""
        rows.append(("draft/target step time (c)", f"{r.draft_step_ratio}{expected}"))
    if r.switch_off_speedup is not None:
        rows.append(("with the switch-off", f"{r.switch_off_speedup}x plain decode"))
    return rows
