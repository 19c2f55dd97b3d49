"""Calibration text for `hearth quantize`: a file the user names, or a built-in default.

The default is the docstrings of the Python standard library, read statically with `ast` from the
running interpreter's own sources: English technical prose and code that every installation
already has (PSF license), so Hearth ships no data file for it. AWQ only picks per-channel scales
from it, which depend little on the domain of the text (Lin et al. 2023, section 5).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from engine.events import BadRequest

DEFAULT_MODULES = (
    "argparse", "ast", "asyncio.events", "calendar", "collections", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "email.message", "enum", "fractions", "functools",
    "gettext", "heapq", "http.client", "inspect", "ipaddress", "json", "locale", "logging",
    "mailbox", "operator", "pathlib", "pickle", "pprint", "random", "re", "shutil", "smtplib",
    "socket", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap",
    "threading", "tokenize", "typing", "unittest.case", "urllib.parse", "uuid", "zipfile",
)  # fmt: skip


def source_docstrings(modules, min_chars: int = 1) -> list[str]:
    """The docstrings of these modules' sources, read statically with `ast` (live objects' change
    with what else is imported, and `python -OO` strips them); none where a module ships no .py."""
    texts: list[str] = []
    for name in modules:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec else None
        if not origin or not origin.endswith(".py") or not Path(origin).is_file():
            continue
        tree = ast.parse(Path(origin).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=True)
                if doc and len(doc) >= min_chars:
                    texts.append(doc)
    return texts


def default_texts() -> list[str]:
    texts = source_docstrings(DEFAULT_MODULES, 201)  # one-liners say little about activations
    if not texts:
        raise BadRequest("this Python has no standard-library sources for the default "
                         "calibration text; pass --calibration FILE")
    return texts


def read_texts(path: str | None) -> list[str]:
    """The calibration texts: the file's (split at blank lines) or the built-in default."""
    if path is None:
        return default_texts()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadRequest(f"calibration file {path} does not exist") from None
    except UnicodeDecodeError:
        raise BadRequest(f"calibration file {path} is not UTF-8 text") from None
    except OSError as e:
        raise BadRequest(f"cannot read calibration file {path}: {e.strerror}") from None
    texts = [t.strip() for t in text.split("\n\n") if t.strip()]
    if not texts:
        raise BadRequest(f"calibration file {path} is empty")
    return texts


def token_blocks(tokenizer, texts: list[str], num_samples: int, seq_len: int) -> list[list[int]]:
    """Texts joined (EOS between them where the tokenizer has one), cut into up to
    `num_samples` blocks of `seq_len` tokens, taken evenly from the whole stream."""
    sep = [tokenizer.eos_token_id] if isinstance(tokenizer.eos_token_id, int) else []
    stream: list[int] = []
    for t in texts:
        ids = tokenizer(t, add_special_tokens=False, verbose=False)["input_ids"]
        stream += list(ids) + sep
    num_blocks = len(stream) // seq_len
    if num_blocks == 0:
        raise BadRequest(f"the calibration text has {len(stream)} tokens; it needs at least "
                         f"{seq_len}")
    step = max(1, num_blocks // num_samples)
    return [stream[b * seq_len:(b + 1) * seq_len]
            for b in range(0, num_blocks, step)][:num_samples]
