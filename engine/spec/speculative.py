"""Speculative decoding: K proposed tokens verified by the target in one pass, the accept rule
that keeps the output exactly the target's, and the generation loop's speculative strategy,
which keeps both caches at the committed length. Not where proposals come from (spec/proposers.py)
nor how K is chosen (spec/controller.py).
"""

from __future__ import annotations

import time

import torch

from engine.cache.kv_cache import KVCache
from engine.spec.constrained_verify import DraftedGrammar
from engine.spec.controller import Controller
from engine.step.decode import Decoder
from engine.step.sampling import Sampler


def accept_greedy(logits: torch.Tensor, proposals: torch.Tensor):
    """logits: [K + 1, V], proposals: [K] -> (n accepted, next token [1]), on the device.

    Greedy: accept while the proposal is the target's argmax; the next token is the target's
    argmax after the accepted run, so the output equals plain greedy decoding token for token.
    """
    best = logits.argmax(-1)  # [K + 1]
    n = (best[:-1] == proposals).int().cumprod(0).sum()  # length of the agreeing run
    return n, best.index_select(0, n.view(1))  # index_select: a tensor index, no host sync


def accept_sampled(p: torch.Tensor, q: torch.Tensor, proposals: torch.Tensor,
                   generator: torch.Generator):
    """p: [K + 1, V] target probabilities, q: [K, V] the proposals' distributions, proposals:
    [K] drawn from q -> (n accepted, next token [1]), on the device, no host sync.

    The rule (Leviathan et al. 2023; Chen et al. 2023), which makes every emitted token a draw
    from p whatever q is:
      accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), in order, stopping at the first
      rejection; at a rejection at i draw from normalize(max(0, p_i - q_i)); if all K pass,
      draw the bonus token from p_K.
    """
    K = proposals.numel()
    rows = torch.arange(K, device=p.device)
    px, qx = p[rows, proposals], q[rows, proposals]
    u = torch.rand(K, device=p.device, generator=generator)
    n = (u * qx < px).int().cumprod(0).sum()  # u < p/q without dividing: q(x) > 0 as x ~ q
    residual = torch.cat([(p[:-1] - q).clamp_min(0), p[-1:]])  # row K: p itself (all passed)
    row = residual.index_select(0, n.view(1))[0]
    # a rejection implies p > q somewhere; fall back to p if rounding erased the residual
    row = torch.where(row.sum() > 0, row, p.index_select(0, n.view(1))[0])
    race = torch.empty_like(row).exponential_(1, generator=generator)
    return n, (row / race).argmax(-1, keepdim=True)  # a draw from row / row.sum()


def verify(target: Decoder, sampler: Sampler, pending: torch.Tensor, position: int,
           proposals: torch.Tensor, q: torch.Tensor | None, allowed: torch.Tensor | None = None
           ) -> tuple[list[int], int, torch.Tensor]:
    """One target pass over [pending, *proposals] at position.. -> (the committed tokens: the
    accepted proposals then one token of the target's, how many were accepted, that last token
    on the device [1]). q: the proposals' distributions; None for a deterministic proposer (a
    point mass) or greedy decoding. allowed: a constrained request's mask at each position
    [K + 1, V] (constrained_verify.DraftedGrammar.masks). A request with logprobs gets those
    of each committed token from its position's raw logits, as a plain step records them.
    """
    raw = target.verify(torch.cat([pending, proposals]), position)  # [K + 1, V]
    n, nxt = judge(sampler, raw, proposals, q, allowed)
    host = torch.cat([n.view(1), nxt, proposals]).tolist()  # the round's one host sync
    accepted = host[0]
    record_logprobs(sampler, raw, proposals, accepted, nxt)
    return host[2:2 + accepted] + [host[1]], accepted, nxt


def judge(sampler: Sampler, raw: torch.Tensor, proposals: torch.Tensor,
          q: torch.Tensor | None, allowed: torch.Tensor | None = None):
    """A verify pass's raw logits [K + 1, V] over [pending, *proposals] -> (n accepted, next
    token [1]) by the request's own rule (greedy or sampled), on the device, no host sync."""
    logits = sampler.target_logits(raw, proposals, allowed)
    if sampler.s.is_greedy:
        return accept_greedy(logits, proposals)
    p = logits.softmax(-1)
    if q is None:  # a point mass on each proposal (scatter: one_hot syncs to validate)
        q = torch.zeros_like(p[:-1]).scatter_(1, proposals[:, None], 1.0)
    return accept_sampled(p, q, proposals, sampler.generator)


def record_logprobs(sampler: Sampler, raw: torch.Tensor, proposals: torch.Tensor,
                    accepted: int, nxt: torch.Tensor) -> None:
    """A request with logprobs gets those of each committed token from its position's raw
    logits, as a plain step records them."""
    if sampler.logprobs is not None:
        sampler.logprobs.record(raw[:accepted + 1], torch.cat([proposals[:accepted], nxt]))


def speculation_stats(control: Controller, name: str) -> dict:
    """A speculating generation's Stats fields: what its proposer proposed and kept."""
    t = control.totals
    return dict(accepted_draft_tokens=t.accepted, proposed_draft_tokens=t.proposed,
                speculation=name, num_speculative_tokens=0 if control.plain_left else control.k,
                mean_accepted_length=round((t.accepted + t.rounds) / t.rounds, 3)
                if t.rounds else 0.0,
                acceptance_rate=round(t.accepted / t.tested, 4) if t.tested else 0.0,
                speculative_speedup=round(control.speedup, 3),
                speculation_switched_off=control.switched_off)


class SpeculativeDecoding:
    """One sequence's speculation by itself (the benchmark's synthetic draft: Session's
    `_speculate_alone`): `next` runs one round, or a plain step when the controller says
    speculation should rest.

    `seq` is every committed token, the pending one last (sampled, shown, not yet fed to the
    target). Rollback: the target cache's token_ids grow by the pending token and the accepted
    proposals only; what rejected proposals wrote sits past that length, is never read (attention
    reads up to the step's end) and is overwritten by the next pass.
    """

    def __init__(self, target: Decoder, cache: KVCache, sampler: Sampler, proposer,
                 control: Controller, seq: list[int]):
        self.target, self.cache, self.sampler = target, cache, sampler
        self.proposer, self.control, self.seq = proposer, control, seq
        self.token: torch.Tensor | None = None  # the pending token on the device
        self.started = False
        self.sync = torch.cuda.synchronize if target.device.type == "cuda" else lambda: None

    def first(self, logits: torch.Tensor) -> list[int]:
        self.token = self.sampler(logits)
        self.seq.append(int(self.token.item()))
        return self.seq[-1:]

    def next(self, position: int, budget: int) -> list[int]:
        """Feed the pending token at `position`; -> 1 to `budget` new committed tokens."""
        k = self.control.next_k(budget - 1)
        if k and not self.started:  # the draft's prefill: only once speculation runs (a
            t = time.perf_counter()  # switched-off session never pays it), and judged
            self.proposer.start(self.seq[:-1])
            self.sync()
            self.control.overhead(time.perf_counter() - t)
            self.started = True
        t0 = time.perf_counter()
        grammar = None if self.sampler.grammar is None else DraftedGrammar(self.sampler.grammar)
        proposals, q = self.proposer.propose(self.seq, k, self.sampler, grammar) if k else \
            (None, None)
        if grammar is not None and proposals is not None:
            proposals, q = grammar.check(proposals, q)  # cut at the first forbidden token
        if proposals is None or proposals.numel() == 0:
            return self._plain(position)
        if self.control.adaptive:
            self.sync()  # time the proposals apart from the verify pass
        t1 = time.perf_counter()
        tokens, accepted, self.token = verify(
            self.target, self.sampler, self.token, position, proposals, q,
            None if grammar is None else grammar.masks(self.target.device))
        if grammar is not None:
            grammar.settle(accepted, tokens[-1])  # rolled back to the accepted length
        self.cache.token_ids.extend(self.seq[-1:] + tokens[:accepted])
        self.proposer.commit(tokens[:accepted], proposals.numel())
        self.sampler.mark(tokens)
        self.seq.extend(tokens)
        t2 = time.perf_counter()
        self.control.round_done(proposals.numel(), accepted, t1 - t0, t2 - t1, t2 - t0)
        return tokens

    def _plain(self, position: int) -> list[int]:
        t0 = time.perf_counter()
        logits = self.target.step(self.token, position)
        self.token = self.sampler(logits)
        tid = int(self.token.item())
        self.cache.token_ids.append(self.seq[-1])
        self.seq.append(tid)
        self.control.plain_done(time.perf_counter() - t0)
        return [tid]

    def stats(self) -> dict:
        return speculation_stats(self.control, self.proposer.name)
