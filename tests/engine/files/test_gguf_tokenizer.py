"""A GGUF import tokenizes as the file says: the imported tokenizer.json gives the ids of a
reference built here from the file's own tables alone (its token list, its merges by rank, and
the split llama.cpp applies for the name in tokenizer.ggml.pre), on text with runs of newlines,
spaces and digits and with non-ASCII letters. The reference is a plain byte-level BPE, written
without the tokenizers library."""

from __future__ import annotations

from pathlib import Path

import pytest
import regex

from engine.files.gguf_import import import_gguf
from tests.fixtures import tiny_gguf

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp's expressions for each name (llama-vocab.cpp), applied one after another
LLAMA_CPP_SPLITS = {
    "smollm": (r"\p{N}", GPT2),
    "gpt2": (GPT2,),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"),
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "llama-bpe": (LLAMA3,),
}
TEXT = ("hello\n\n12 apples\n\n\n2024 hello's  café,\n \n   東京 😀!! 3.14159\n\n"
        "  \t hello\n\n\n\n7 ... done  \n")


def byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes (the vocabulary's alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    spelled, extra = {}, 0
    for b in range(256):
        if b in keep:
            spelled[b] = chr(b)
        else:
            spelled[b] = chr(256 + extra)
            extra += 1
    return [spelled[b] for b in range(256)]


SPELL = byte_alphabet()


def spell(text: str) -> str:
    return "".join(SPELL[b] for b in text.encode("utf-8"))


class Reference:
    """Byte-level BPE from a GGUF's tables: pre-split by the expressions, merges by rank."""

    def __init__(self, tokens: list[str], merges: list[str], exprs: tuple[str, ...]):
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.rank = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
        self.exprs = exprs
        self.merged: dict[str, tuple[int, ...]] = {}

    def pieces(self, text: str) -> list[str]:
        parts = [text]
        for expr in self.exprs:  # each expression cuts the pieces the previous one left
            cut = []
            for part in parts:
                at = 0
                for m in regex.finditer(expr, part):
                    cut += [s for s in (part[at:m.start()], m.group()) if s]
                    at = m.end()
                cut += [part[at:]] if at < len(part) else []
            parts = cut
        return parts

    def merge(self, word: str) -> tuple[int, ...]:
        if word in self.merged:
            return self.merged[word]
        syms = list(word)
        while len(syms) > 1:
            pairs = [(self.rank.get(p, len(self.rank)), i)
                     for i, p in enumerate(zip(syms, syms[1:], strict=False))]
            best, i = min(pairs)
            if best == len(self.rank):
                break
            syms[i:i + 2] = [syms[i] + syms[i + 1]]
        self.merged[word] = tuple(self.ids[s] for s in syms)
        return self.merged[word]

    def encode(self, text: str) -> list[int]:
        return [i for piece in self.pieces(text) for i in self.merge(spell(piece))]


def vocabulary() -> tuple[list[str], list[str]]:
    """Every byte, then merges that tell the splits apart: newline and space runs, digit pairs
    and a space before a digit, punctuation runs, words, and multi-byte letters."""
    pairs = [("Ċ", "Ċ"), ("ĊĊ", "Ċ"), ("ĊĊ", "ĊĊ"), ("Ġ", "Ġ"), ("ĠĠ", "Ġ"), ("ĠĠ", "ĠĠ"),
             ("Ġ", "Ċ"), ("1", "2"), ("2", "0"), ("20", "2"), ("Ġ", "1"), ("Ġ", "3"),
             ("1", "4"), ("!", "!"), (".", "."), ("..", "."), ("Ġ", "."), (",", "Ċ"),
             ("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "hello"), ("'", "s"),
             ("a", "p"), ("ap", "p"), ("l", "e"), ("le", "s"), ("app", "les"), ("Ġ", "apples")]
    for word in ("é", "東", "京", "😀", " café"):
        syms = list(spell(word))
        while len(syms) > 1:
            pairs.append((syms[0], syms[1]))
            syms[:2] = [syms[0] + syms[1]]
    tokens = ["<|endoftext|>", *SPELL]
    for a, b in pairs:
        if a + b not in tokens:
            tokens.append(a + b)
    return tokens, [f"{a} {b}" for a, b in pairs]


def file_tables(path: Path) -> tuple[list[str], list[str], str]:
    import gguf

    fields = gguf.GGUFReader(str(path)).fields
    return (fields["tokenizer.ggml.tokens"].contents(), fields["tokenizer.ggml.merges"].contents(),
            fields["tokenizer.ggml.pre"].contents())


@pytest.mark.parametrize("pre", sorted(LLAMA_CPP_SPLITS))
def test_an_imported_tokenizer_splits_and_merges_as_its_file_says(tmp_path, pre):
    from tokenizers import Tokenizer

    tokens, merges = vocabulary()
    path = tiny_gguf.write(tmp_path / "t.gguf", tokens=tokens, merges=merges, pre=pre)
    folder = import_gguf(path, tmp_path / "imported", lambda _event: None)
    file_tokens, file_merges, file_pre = file_tables(path)
    reference = Reference(file_tokens, file_merges, LLAMA_CPP_SPLITS[file_pre])
    imported = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in (TEXT, TEXT.strip(), "x\n\n2", " 12\n\n\n", "a" + " " * 5 + "b\n \n\n1"):
        assert imported.encode(text, add_special_tokens=False).ids == reference.encode(text)
    assert imported.decode(reference.encode(TEXT)) == TEXT


def test_smollm2_imported_tokenizes_as_its_file_says(smollm2):
    """The real file: SmolLM2's GGUF names "smollm" (digits cut one by one before GPT-2's
    split), so "\\n\\n" before a digit is one token, as llama.cpp makes it. Its tables are read
    from the imported copy (the fixture keeps no 98 MB GGUF), checked whole by their counts."""
    import json

    from tokenizers import Tokenizer

    saved = json.loads((smollm2 / "tokenizer.json").read_text())["model"]
    vocab, merges = saved["vocab"], saved["merges"]
    assert len(vocab) == 49152 and len(merges) == 48900  # the file's tables, whole
    tokens = sorted(vocab, key=vocab.get)
    reference = Reference(tokens, [" ".join(m) if isinstance(m, list) else m for m in merges],
                          LLAMA_CPP_SPLITS["smollm"])
    imported = Tokenizer.from_file(str(smollm2 / "tokenizer.json"))
    text = TEXT * 4 + "Steps:\n\n1. Mix.\n\n2. Bake 350 minutes.\n\n\n3. Enjoy 🍰, naïve façade."
    assert imported.encode(text, add_special_tokens=False).ids == reference.encode(text)
    assert imported.encode("x\n\n2", add_special_tokens=False).ids == [
        vocab["x"], vocab["ĊĊ"], vocab["2"]]
