"""Prefill chunks of several sequences in one pass of the family step (continuous batching, issue
25): their tokens packed one after another, so every linear layer runs once over all of them
(one large GEMM instead of a pass per sequence, and one pass's kernel launches), each token's K/V
written through its own sequence's block table, and attention taken a sequence at a time over
that sequence's blocks, exactly as its own prefill chunk takes it (FamilyStep.block's attention:
the decode kernel reading the blocks in place, causal by position). Only the last token of each
chunk goes through the lm_head, but every token of a verify row (speculative decoding in a batch:
the pending token and its proposals, whose logits are all needed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.attention import paged

if TYPE_CHECKING:
    from engine.models.layers import FamilyStep


@dataclass(frozen=True)
class PassRow:
    """One row of a pass as the model sees it: a batch's chunk (batch/sequence.py Chunk: which
    sequence, which of its tokens) turned into ids, a position and that sequence's blocks."""

    token_ids: list[int]  # the chunk's tokens
    start: int  # the position of its first
    block_ids: list[int]  # its sequence's blocks, reserved past start + len(token_ids)
    every: bool = False  # a verify row: the logits of every token, not the last only


def run(step: FamilyStep, chunks: list[PassRow], kv_len_of, max_blocks: int, scratch: int,
        device: torch.device) -> torch.Tensor:
    """-> logits [len(chunks), V]: row c the next-token logits after chunk c's last token (a
    chunk with `every`: a row after each of its tokens, in order, in its place among the rows).
    kv_len_of(end): the KV bucket a chunk ending at `end` attends over (the decoder's)."""
    tokens, positions, segment, rows, keep, spans = [], [], [], [], [], []
    for c, chunk in enumerate(chunks):
        T = len(chunk.token_ids)
        tokens += chunk.token_ids
        positions += range(chunk.start, chunk.start + T)
        segment += [c] * T
        rows.append(list(chunk.block_ids) + [scratch] * (max_blocks - len(chunk.block_ids)))
        keep.extend(range(len(tokens) - T if chunk.every else len(tokens) - 1, len(tokens)))
        spans.append((len(tokens) - T, len(tokens), kv_len_of(chunk.start + T)))
    host = torch.tensor([tokens, positions, segment], dtype=torch.long)
    ids, pos, seg = host.to(device).unbind(0)  # one copy to the device
    tables = torch.tensor(rows, dtype=torch.int32).to(device)  # [S, max_blocks]
    token_table = tables[seg]  # [T, max_blocks]: token t's sequence's blocks, for its K/V write
    # each chunk's queries over its own sequence's blocks, as its own prefill chunk reads them
    row_spans = [paged.Row(*span, tables[c]) for c, span in enumerate(spans)]
    attention = step._per_layer(lambda w, cap: paged.of(step.cache).over(
        pos, row_spans, step.scaling, w, cap))
    return step.prefill_batch(ids, pos, token_table, attention,
                              torch.tensor(keep, device=device))
