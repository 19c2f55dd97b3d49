"""A draft model's proposals for the speculating rows of a batch (batch/speculative_rows.py):
one draft sequence per row, in the draft session's own paged arena, run by its batched decoder
(step/batched.py). Before a step each drafting row catches up on the tokens its target committed
since the round before (the prompt at first, in prefill chunks; a few tokens in batched steps),
from the length whose K/V the draft holds: what rejected proposals wrote there is overwritten.
Then up to K batched steps run over every drafting row at once, each row stopping at its own K
(or where its grammar takes no more). The proposals are those the
draft proposes for a generation alone (spec/proposers.py DraftModel: a batch of one): the same
catch-up, the same choice of token (greedy, or drawn from the target's filters), the same commit
(the draft keeps the K/V of the accepted proposals it fed, not the last one, which it never fed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.cache.block_manager import OutOfBlocks
from engine.cache.block_manager import Sequence as BlockTable
from engine.plan.memory import PREFILL_CHUNK

MAX_STEP_CATCH_UP = 4  # up to this many missing tokens go through decode steps; more through
# prefill chunks


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
    """What one row asks of a step: its committed tokens (the pending one last), at most k
    proposals, its sampler and its round's grammar (spec/constrained_verify.DraftedGrammar)."""

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
        """After a failed step: no block of the draft arena is trusted."""
        for seq in list(self.live):
            self.release(seq)
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
        logits = self._catch_up(asks)
        live = list(zip(asks, logits, strict=True))
        i = 0
        while live:
            feeding = []
            for ask, row in live:
                row = fit(row, self.vocab)
                if ask.grammar is not None:
                    row = ask.grammar.constrain(row)
                if ask.sampler.s.is_greedy:
                    token, q = row.argmax(-1, keepdim=True), None
                else:  # the target's own filters, so q is near p
                    q = ask.sampler.filter(ask.sampler.penalize(row.float(), ask.sampler.seen)
                                           ).softmax(-1)
                    token = ask.sampler.race(q)
                if ask.grammar is not None and not ask.grammar.take(int(token.item())):
                    continue  # nothing the draft can write is allowed
                ask.tokens.append(token)
                ask.qs.append(q)
                if i + 1 < ask.k and (ask.grammar is None or ask.grammar.open):
                    feeding.append(ask)  # the last proposal is fed only if accepted
            if not feeding:
                break
            steps = self._step([a.seq for a in feeding], torch.cat([a.tokens[-1] for a in feeding]),
                               [len(a.ids) + i for a in feeding])
            live = list(zip(feeding, steps, strict=True))
            i += 1
        for a in asks:
            if a.tokens:
                out[a.seq] = (torch.cat(a.tokens),
                              None if a.qs[0] is None else torch.stack(a.qs))
        return out

    def _catch_up(self, asks: list[Ask]) -> list[torch.Tensor]:
        """Feed each row's committed tokens the draft has not seen -> its logits after the
        last, [V] each: a few through batched steps, more through prefill chunks."""
        out: list[torch.Tensor | None] = [None] * len(asks)
        short = [j for j, a in enumerate(asks) if len(a.ids) - len(a.seq.fed) <= MAX_STEP_CATCH_UP]
        for j in (j for j in range(len(asks)) if j not in short):
            a = asks[j]
            for lo in range(len(a.seq.fed), len(a.ids), PREFILL_CHUNK):
                ids = [min(t, self.last_id) for t in a.ids[lo:lo + PREFILL_CHUNK]]
                self.cache.bind(a.seq.table)
                logits = self.decoder.forward(torch.tensor(ids, device=self.device), lo)
            out[j] = logits.clone()
        n = 0
        while True:
            now = [j for j in short if len(asks[j].seq.fed) + n < len(asks[j].ids)]
            if not now:
                break
            at = [len(asks[j].seq.fed) + n for j in now]
            ids = torch.tensor([asks[j].ids[p] for j, p in zip(now, at, strict=True)],
                               dtype=torch.long, device=self.device)
            logits = self._step([asks[j].seq for j in now], ids, at)
            for r, (j, p) in enumerate(zip(now, at, strict=True)):
                if p + 1 == len(asks[j].ids):
                    out[j] = logits[r].clone()  # a later step reuses the buffer
            n += 1
        for a in asks:
            a.seq.fed = list(a.ids)
        return out

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
