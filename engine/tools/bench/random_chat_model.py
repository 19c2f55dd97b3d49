"""A model of a real shape with random weights that talks through a real tokenizer: the shape's
config.json with the tokenizer's vocabulary, so that generated ids decode to text a stream can
carry and a chat template applies (the server's benchmarks and its load test on a GPU)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from engine.events import LoadRequest

if TYPE_CHECKING:
    from engine.load.loader import LoadedModel

TOKENIZER_FILES = ("tokenizer", "special_tokens", "vocab", "merges")


def random_chat_model(shape_dir: str | Path, tokenizer_dir: str | Path,
                      req: LoadRequest) -> LoadedModel:
    """`shape_dir`'s config.json (its vocabulary replaced by the tokenizer's) with random weights
    (seeded: the same each load) and `tokenizer_dir`'s tokenizer and chat template."""
    from transformers import AutoTokenizer

    from engine.config import overrides
    from engine.files.model_folder import config_only_folder
    from engine.load import loader

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    folder = Path(tempfile.mkdtemp(prefix="hearth-random-chat-"))
    config = json.loads((Path(shape_dir) / "config.json").read_text())
    config["vocab_size"] = len(tok)
    (folder / "config.json").write_text(json.dumps(config))
    for f in Path(tokenizer_dir).iterdir():
        if f.name.startswith(TOKENIZER_FILES):
            shutil.copy2(f, folder / f.name)
    lm = loader.random_model(config_only_folder(str(folder)), req, overrides.backends())
    return dataclasses.replace(lm, tokenizer=tok)
