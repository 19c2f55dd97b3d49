"""Speculative decoding: K proposed tokens verified by the target in one pass, the accept rule
that keeps the output exactly the target's, and the generation loop's speculative strategy,
which keeps both caches at the committed length. Not where proposals come from (spec/proposers.py)
nor how K is chosen (spec/controller.py).
"""

from __future__ import annotations

import torch

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
