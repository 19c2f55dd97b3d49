"""Read the committed corpus splits (corpus/{train,valid,heldout}.jsonl.xz); see gather.py."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPLITS = ("train", "valid", "heldout")
HELDOUT_TEXT = HERE / "heldout.txt"  # the held-out split shaped by shape.documents(seed=0)


def load(split: str) -> list[dict]:
    """Records {name, kind, signature, doc}, in the order gather.py wrote them."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    with lzma.open(HERE / "corpus" / f"{split}.jsonl.xz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]
