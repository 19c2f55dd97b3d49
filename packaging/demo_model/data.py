"""Token streams for training: shaped documents, tokenized once, packed into rows each epoch.

Documents are joined with <|endoftext|> and cut into rows of seq+1 tokens (inputs and shifted
targets); no attention mask across documents, as in GPT-style pretraining. Each epoch takes the
next shaping variant (other question phrasings and edit tasks for the same docstrings) in a new
document order: the corpus is small, so the model should not see one fixed sequence of it.
"""

from __future__ import annotations

import random
from pathlib import Path

import corpus
import numpy as np
import shape
import torch


class Tokens:
    """The committed tokenizer.json, through `tokenizers` alone (fast batch encoding)."""

    def __init__(self, tokenizer_dir: Path):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        self.endoftext = self.tok.token_to_id(shape.ENDOFTEXT)

    def encode_documents(self, docs: list[str]) -> list[np.ndarray]:
        """Each document's ids followed by <|endoftext|>."""
        encoded = self.tok.encode_batch(docs, add_special_tokens=False)
        return [np.array([*e.ids, self.endoftext], dtype=np.int32) for e in encoded]

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids


class Stream:
    """Batches [B, seq+1] of a split, epoch after epoch, on `device`."""

    def __init__(self, tokens: Tokens, split: str, num_variants: int, seq: int, batch: int,
                 device: torch.device, seed: int = 0):
        records = corpus.load(split)
        self.variants = [tokens.encode_documents(shape.documents(records, seed=v))
                         for v in range(num_variants)]
        self.seq, self.batch, self.device, self.seed = seq, batch, device, seed
        self.epoch = 0
        self.tokens_per_epoch = sum(map(len, self.variants[0]))

    def rows(self, epoch: int) -> torch.Tensor:
        docs = list(self.variants[epoch % len(self.variants)])
        random.Random(f"{self.seed}:{epoch}").shuffle(docs)
        flat = torch.from_numpy(np.concatenate(docs).astype(np.int64))
        n = (flat.numel() - 1) // self.seq
        # row i: tokens i*seq .. (i+1)*seq inclusive, so inputs and targets share the row
        idx = torch.arange(n)[:, None] * self.seq + torch.arange(self.seq + 1)[None, :]
        rows = flat[idx]
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return rows[torch.randperm(n, generator=g)]

    def __iter__(self):
        while True:
            rows = self.rows(self.epoch).to(self.device)
            for lo in range(0, rows.shape[0] - self.batch + 1, self.batch):
                yield rows[lo:lo + self.batch]
            self.epoch += 1


def fixed_rows(tokens: Tokens, split: str, seq: int, device: torch.device,
               max_rows: int | None = None) -> torch.Tensor:
    """A split shaped once (seed 0), in order, as rows [N, seq+1]: the validation set."""
    docs = tokens.encode_documents(shape.documents(corpus.load(split), seed=0))
    flat = torch.from_numpy(np.concatenate(docs).astype(np.int64))
    n = (flat.numel() - 1) // seq
    if max_rows is not None:
        n = min(n, max_rows)
    idx = torch.arange(n)[:, None] * seq + torch.arange(seq + 1)[None, :]
    return flat[idx].to(device)
