"""Where speculative tokens come from: a draft model (its own cache and decode step), prompt
lookup (the latest earlier match of the last few tokens in the conversation so far), and the
benchmark-only synthetic draft. Each proposes K token ids on the device and, where they were
sampled, the distributions they were drawn from; verification is spec/speculative.py's.

Every proposer sees `seq`: the committed tokens, the pending one (not yet fed) last.
"""

from __future__ import annotations

import random
import time

import torch

from engine.events import BadRequest
from engine.plan.memory import PREFILL_CHUNK
from engine.step.sampling import Sampler

MAX_STEP_CATCH_UP = 4  # up to this many missing tokens go through decode steps; more go
# through one prefill-like pass unless steps were measured to be cheaper (an eager forward's
# host work, whatever its length, can cost as much as a hundred graph steps of a tiny draft)
STEP_SAMPLES = 8  # catch-ups timed (with a device sync) to learn the draft's step time
PROMPT_LOOKUP_NGRAMS = (3, 2, 1)  # the longest suffix that matches earlier decides


def check_same_tokenizer(target_tok, draft_tok, draft_path: str) -> None:
    """A draft's ids must mean the target's tokens: compare the vocabularies token by token
    (not vocab_size: models that share a tokenizer may pad their embeddings differently)."""
    a, b = target_tok.get_vocab(), draft_tok.get_vocab()
    if a != b:
        differ = sum(b.get(tok) != i for tok, i in a.items()) + len(set(b) - set(a))
        raise BadRequest(f"the draft model {draft_path} has another tokenizer than the target "
                         f"({differ} of {len(a)} tokens differ); a draft must share the "
                         "target's tokenizer")


def fit(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Draft logits [..., V_d] -> [..., vocab]: cut padding rows the target lacks, or give the
    target's extra (padding) ids no draft probability."""
    size = logits.shape[-1]
    if size >= vocab:
        return logits[..., :vocab]
    pad = logits.new_full((*logits.shape[:-1], vocab - size), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


class DraftModel:
    """A small model with the target's tokenizer, decoding in its own Session (cache, graphs)."""

    name = "draft"

    def __init__(self, draft_session, vocab: int):
        self.session = draft_session
        self.decoder, self.cache = draft_session.decoder, draft_session.cache
        self.device = draft_session.lm.device
        self.vocab = vocab  # the target's logits width
        # ids past the draft's embedding (the target's padding rows, which random weights can
        # emit) are fed as the last row: a proposal may then be wrong, never out of bounds
        self.last_id = draft_session.lm.model.get_input_embeddings().num_embeddings - 1
        self.step_s: list[float] = []  # seconds per catch-up token through decode steps
        self.forward_s: float | None = None  # seconds of the cheapest catch-up pass timed
        self.passes = 0  # catch-up passes run: the first pays first uses (kernels compiled for
        # this shape, allocations) and is not timed: timed, it can make steps look cheaper, and
        # once steps are chosen no pass is timed again to correct it
        self.sync = torch.cuda.synchronize if self.device.type == "cuda" else lambda: None
        # after a round whose proposals were all accepted, two tokens are new to the draft (its
        # last proposal, never fed, and the target's bonus token): one two-token pass, captured
        # like a verify block, costs about one step, so a round costs K draft steps, not K + 1
        self.decoder.capture_blocks([2])  # once per draft; a no-op without CUDA graphs
        self.pair = self.decoder.mode != "graph" or any(
            T == 2 for T, _ in self.decoder.block_graphs)

    def start(self, ids: list[int]) -> None:
        """A new generation over prompt `ids`: prefill what the draft cache lacks."""
        self.cache.reuse(ids)
        self._catch_up(ids)

    def _by_steps(self, n: int) -> bool:
        if n <= MAX_STEP_CATCH_UP:
            return True
        if not self.step_s or self.forward_s is None:
            return False
        return n * sorted(self.step_s)[len(self.step_s) // 2] < self.forward_s

    def _catch_up(self, seq: list[int]) -> torch.Tensor:
        """Feed the committed tokens the draft has not seen -> its logits after seq[-1]."""
        have = len(self.cache.token_ids)
        missing = torch.tensor(seq[have:], dtype=torch.long, device=self.device)
        missing.clamp_(max=self.last_id)
        n = missing.numel()
        if n == 2 and self.pair:
            logits = self.decoder.verify(missing, have)[-1]  # [V]
            self.cache.token_ids.extend(seq[have:])
            return logits
        by_steps = self._by_steps(n)
        timed = not by_steps or len(self.step_s) < STEP_SAMPLES
        if timed:
            self.sync()
            t0 = time.perf_counter()
        if by_steps:
            for i in range(n):
                logits = self.decoder.step(missing[i:i + 1], have + i)
        else:
            for lo in range(0, n, PREFILL_CHUNK):
                logits = self.decoder.forward(missing[lo:lo + PREFILL_CHUNK], have + lo)
        if timed:
            self.sync()
            seconds = time.perf_counter() - t0
            if by_steps:
                self.step_s.append(seconds / n)
            elif n <= PREFILL_CHUNK and self.passes:  # one pass: what a long catch-up
                # costs at least
                self.forward_s = seconds if self.forward_s is None else min(self.forward_s,
                                                                              seconds)
            self.passes += not by_steps
        self.cache.token_ids.extend(seq[have:])
        return logits

    def propose(self, seq: list[int], k: int, sampler: Sampler, grammar=None):
        """-> (tokens [k], their distributions [k, V] or None for greedy). grammar: a
        constrained request's DraftedGrammar (spec/constrained_verify.py): the draft drafts
        under its mask and it takes each token (fewer than k once the answer is complete)."""
        logits = self._catch_up(seq)
        tokens, qs = [], []
        for i in range(k):
            logits = fit(logits, self.vocab)
            if grammar is not None:
                logits = grammar.constrain(logits)
            if sampler.s.is_greedy:
                token, q = logits.argmax(-1, keepdim=True), None
            else:  # the target's own filters, so q is near p
                q = sampler.filter(sampler.penalize(logits.float(), sampler.seen)).softmax(-1)
                token = sampler.race(q)
            if grammar is not None and not grammar.take(int(token.item())):
                break  # nothing the draft can write is allowed (ids past its vocabulary)
            tokens.append(token)
            qs.append(q)
            if i + 1 == k or (grammar is not None and not grammar.open):
                break  # the last proposal is fed only if accepted (next round's catch-up)
            logits = self.decoder.step(token, len(seq) + i)
        if not tokens:
            return None, None
        return torch.cat(tokens), None if qs[0] is None else torch.stack(qs)

    def commit(self, accepted: list[int], proposed: int) -> None:
        """Rollback: keep the draft's K/V of accepted proposals it has fed (not the last)."""
        self.cache.token_ids.extend(accepted[:proposed - 1])


class PromptLookup:
    """No model: propose what followed the latest earlier occurrence of the sequence's last n
    tokens (n = 3, 2, 1, longest first). An index of n-grams keeps each lookup O(1)."""

    name = "prompt_lookup"

    def __init__(self, device: torch.device):
        self.device = device
        self.index: dict[int, dict[tuple[int, ...], int]] = {}
        self.indexed = 0

    def start(self, ids: list[int]) -> None:
        self.index = {n: {} for n in PROMPT_LOOKUP_NGRAMS}
        self.indexed = 0

    def _extend(self, seq: list[int]) -> None:
        # an entry maps an n-gram to the position of the token that followed it (latest wins)
        for e in range(max(self.indexed, 1), len(seq)):
            for n, table in self.index.items():
                if e >= n:
                    table[tuple(seq[e - n:e])] = e
        self.indexed = max(self.indexed, len(seq))

    def propose(self, seq: list[int], k: int, sampler: Sampler, grammar=None):
        """The tokens that followed the match (a grammar checks them after: verify's caller)."""
        self._extend(seq)
        for n, table in self.index.items():
            e = table.get(tuple(seq[-n:]))
            if e is not None:
                found = seq[e:e + k]
                return torch.tensor(found, dtype=torch.long, device=self.device), None
        return None, None

    def commit(self, accepted: list[int], proposed: int) -> None:
        pass


class SyntheticDraft(DraftModel):
    """Benchmark only (`hearth bench --synthetic-acceptance A`): runs the real draft forward for
    its cost, but proposes the target's own greedy continuation (`reference`: a plain greedy
    run's prompt and output), each token wrong with probability 1 - A, so the acceptance rate
    is A by construction. Greedy decoding only."""

    name = "synthetic"

    def __init__(self, draft_session, vocab: int, acceptance: float, seed: int = 0):
        super().__init__(draft_session, vocab)
        self.acceptance = acceptance
        self.rng = random.Random(seed)
        self.reference: list[int] = []

    def propose(self, seq: list[int], k: int, sampler: Sampler, grammar=None):
        if not sampler.s.is_greedy:
            raise BadRequest("the synthetic draft measures greedy decoding only")
        logits = self._catch_up(seq)
        chosen = []
        for i in range(len(seq), len(seq) + k):
            right = self.reference[i] if i < len(self.reference) else 0
            wrong = (right + 1) % self.vocab
            chosen.append(right if self.rng.random() < self.acceptance else wrong)
        tokens = torch.tensor(chosen, dtype=torch.long, device=self.device)  # one copy a round
        fed = tokens.clamp(max=self.last_id)
        for i in range(k):
            logits.argmax(-1)  # what a real draft computes per proposal
            if i + 1 < k:
                logits = self.decoder.step(fed[i:i + 1], len(seq) + i)
        return tokens, None
