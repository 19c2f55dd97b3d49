"""A draft model's proposals for the speculating rows of a batch (batch/speculative_rows.py):
one draft sequence per row, in the draft session's own paged arena, run by its batched decoder
(step/batched.py). Each round a row catches up on the tokens its target committed since the
last (the prompt at first) from the length whose K/V the draft holds (what rejected proposals
wrote there is overwritten): all but the last in prefill chunks, then the last and each proposal
but the last in batched steps over every drafting row at once, each row stopping at its own K
or where its grammar takes no more. A generation alone drafts as a batch of one
(spec/proposers.py DraftModel). The draft keeps the K/V of the accepted proposals it fed, not
the last one, which it never fed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.cache.block_manager import OutOfBlocks
from engine.cache.block_manager import Sequence as BlockTable
from engine.plan.memory import PREFILL_CHUNK


def fit(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Draft logits [..., V_d] -> [..., vocab]: cut padding rows the target lacks, or give the
    target's extra (padding) ids no draft probability."""
    size = logits.shape[-1]
    if size >= vocab:
        return logits[..., :vocab]
    pad = logits.new_full((*logits.shape[:-1], vocab - size), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


@dataclass(eq=False)
class DraftSeq:
    """One row's draft sequence: its blocks in the draft arena and the committed tokens whose
    K/V they hold (a request's proposer: `commit` after each verified round)."""

    name = "draft"
    table: BlockTable = field(default_factory=BlockTable)
    fed: list[int] = field(default_factory=list)
    blocks: object = None  # the arena's BlockManager it was given blocks by (a cleared cache
    # has a new one: the old blocks are gone with it)
    epoch: int = 0  # a new table after each release: the batched step's row cache key

    def commit(self, accepted: list[int], proposed: int) -> None:
        self.fed.extend(accepted[:proposed - 1])


@dataclass
class Ask:
    """One row's round: its committed tokens (the pending one last), at most k proposals, its
    sampler and grammar (spec/constrained_verify.DraftedGrammar); what it drafted."""

    seq: DraftSeq
    ids: list[int]
    k: int
    sampler: object
    grammar: object = None
    tokens: list[torch.Tensor] = field(default_factory=list)
    qs: list[torch.Tensor | None] = field(default_factory=list)


class DraftRows:
    """The draft side of one batch: its rows' sequences in the draft session's arena."""

    def __init__(self, draft_session, vocab: int, max_rows: int):
        self.cache, self.decoder = draft_session.cache, draft_session.decoder
        # a draft through transformers' modules (no family step) runs its rows one by one
        self.batched = draft_session.batched_decoder(max_rows) \
            if self.decoder.family is not None else None
        self.device = draft_session.lm.device
        self.vocab = vocab  # the target's logits width
        # ids past the draft's embedding (the target's padding rows) are fed as its last row
        self.last_id = draft_session.lm.model.get_input_embeddings().num_embeddings - 1
        self.live: set[DraftSeq] = set()  # sequences holding blocks

    def release(self, seq: DraftSeq) -> None:
        """`seq`'s blocks go back (its full blocks stay cached by hash); with no sequence left
        the draft cache is bound to none of them."""
        if seq in self.live and seq.blocks is self.cache.blocks:
            seq.blocks.commit(seq.table, seq.fed[:seq.table.num_tokens])
            seq.blocks.release(seq.table)
        self.live.discard(seq)
        seq.table, seq.fed, seq.blocks, seq.epoch = BlockTable(), [], None, seq.epoch + 1
        if not self.live:
            self.cache.unbind()

    def clear(self) -> None:
        """After a failed step: no block of the draft arena is trusted (a sequence's blocks
        are gone with the arena's BlockManager)."""
        self.live.clear()
        self.cache.clear()

    def _reserve(self, ask: Ask) -> bool:
        """Blocks for every position the round feeds (catch-up, then k - 1 proposals); a row
        the arena cannot hold gives its blocks back and proposes nothing this step."""
        seq, blocks = ask.seq, self.cache.blocks
        if seq.blocks is not blocks:  # new, released, or its arena was cleared since
            self.release(seq)
        try:
            if seq not in self.live:
                start = blocks.allocate(seq.table, ask.ids)
                seq.fed, seq.blocks = list(ask.ids[:start]), blocks
                self.live.add(seq)
            blocks.append(seq.table, len(ask.ids) + ask.k - 1)
            del seq.fed[len(ask.ids) - 1:]  # its last token's logits are the first proposal's
            return True
        except OutOfBlocks:
            self.release(seq)
            return False

    @torch.inference_mode()
    def propose(self, asks: list[Ask]) -> dict[DraftSeq, tuple]:
        """Each row's (proposals [n] on the device, their distributions [n, V] or None for
        greedy), or (None, None) where it has none."""
        out = {a.seq: (None, None) for a in asks}
        asks = [a for a in asks if self._reserve(a)]
        for a in asks:  # what it lacks but the last token: prefill chunks
            for lo in range(len(a.seq.fed), len(a.ids) - 1, PREFILL_CHUNK):
                ids = [min(t, self.last_id) for t in a.ids[lo:min(lo + PREFILL_CHUNK,
                                                                  len(a.ids) - 1)]]
                self.cache.bind(a.seq.table)
                self.decoder.forward(torch.tensor(ids, device=self.device), lo)
            a.seq.fed = list(a.ids)
        feeding, i = asks, 0
        tokens = torch.tensor([a.ids[-1] for a in asks], dtype=torch.long, device=self.device)
        while feeding:  # the last token, then each proposal but the last, all rows at once
            logits = self._step([a.seq for a in feeding], tokens,
                                [len(a.ids) - 1 + i for a in feeding])
            feeding, i = [a for a, row in zip(feeding, logits, strict=True)
                          if self._choose(a, row, i)], i + 1
            if feeding:
                tokens = torch.cat([a.tokens[-1] for a in feeding])
        for a in asks:
            if a.tokens:
                out[a.seq] = (torch.cat(a.tokens), None if a.qs[0] is None else torch.stack(a.qs))
        return out

    def _choose(self, ask: Ask, logits: torch.Tensor, i: int) -> bool:
        """The row's proposal i from the draft's logits [V] -> whether it drafts on."""
        logits = fit(logits, self.vocab)
        if ask.grammar is not None:
            logits = ask.grammar.constrain(logits)
        if ask.sampler.s.is_greedy:
            token, q = logits.argmax(-1, keepdim=True), None
        else:  # the target's own filters, so q is near p
            q = ask.sampler.filter(ask.sampler.penalize(logits.float(), ask.sampler.seen)
                                   ).softmax(-1)
            token = ask.sampler.race(q)
        if ask.grammar is not None and not ask.grammar.take(int(token.item())):
            return False  # nothing the draft can write is allowed
        ask.tokens.append(token)
        ask.qs.append(q)
        # the last proposal is fed only if accepted (the next round's catch-up)
        return i + 1 < ask.k and (ask.grammar is None or ask.grammar.open)

    def _step(self, seqs: list[DraftSeq], ids: torch.Tensor, positions: list[int]
              ) -> torch.Tensor:
        """One token for each of `seqs` (ids [n] on the device) at its position -> logits
        [n, V]: one row through the draft decoder's own step (its graphs), more together."""
        ids = ids.clamp(max=self.last_id)
        if self.batched is None or (len(seqs) == 1 and self.batched.solo):
            out = []
            for i, (seq, position) in enumerate(zip(seqs, positions, strict=True)):
                self.cache.bind(seq.table)
                out.append(self.decoder.step(ids[i:i + 1], position))
            return torch.stack(out) if len(out) > 1 else out[0].view(1, -1)
        return self.batched.step([0] * len(seqs), positions,
                                 [((s, s.epoch), s.table) for s in seqs],
                                 (ids, list(range(len(seqs)))))
