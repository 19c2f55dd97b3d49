"""How a GGUF file's byte-level BPE text is cut before its merges apply, from the name it
states in tokenizer.ggml.pre: llama.cpp's table of regular expressions for that name, applied in
turn (each one splits the pieces the previous left, keeping what lies between matches).

transformers' GGUF reader knows some of these names and gives every other one GPT-2's split;
for SmolLM2's "smollm" that drops the digit split, so "\\n\\n" before a digit became two
newline tokens where the file's own rules (and llama.cpp) make one. No torch here; the
tokenizers library only when a tokenizer is changed."""

from __future__ import annotations

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"

# tokenizer.ggml.pre -> the expressions llama.cpp applies, in order. The names transformers'
# reader already splits as llama.cpp does (llama3, qwen2, tekken, gpt-4o, ...) are left to it.
SPLITS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone",
                     "minerva"), (r"\p{N}", GPT2_SPLIT)),
    **dict.fromkeys(("gpt2", "mpt", "olmo", "jais", "trillion", "granite-docling"),
                    (GPT2_SPLIT,)),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2_SPLIT, r"[0-9][0-9][0-9]"),
    # a file that names no split (or "default") gets llama.cpp's fallback, not GPT-2's
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]"),
}


def splits(pre: object) -> tuple[str, ...] | None:
    """The expressions for a tokenizer.ggml.pre value, or None where transformers decides."""
    if pre is None or pre == "":
        return SPLITS["default"]
    return SPLITS.get(pre) if isinstance(pre, str) else None


def follow_file(tokenizer, pre: object, model: object) -> None:
    """Give a byte-level BPE tokenizer (transformers' fast one) the split its file names."""
    exprs = splits(pre)
    if exprs is None or model != "gpt2":
        return
    from tokenizers import Regex, pre_tokenizers

    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [*(pre_tokenizers.Split(Regex(e), behavior="isolated") for e in exprs),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
