"""What a GGUF file's header promises, held against what the file holds (no torch here): the
sizes it states, every tensor its architecture needs at the shape those sizes imply, and a
tokenizer whose merges and special ids stay inside its token list. transformers would build a
model from the header alone and fill whatever the file lacks with random values; a claim the
file cannot back is refused here, in one sentence, before any work."""

from __future__ import annotations

from collections.abc import Callable

from engine.formats import families
from engine.formats.model_shape import MAX_SIZES

# GGUF architectures whose attention and MLP projections are stored fused (llama.cpp's Phi-3)
FUSED = ("phi3",)
SPECIAL_IDS = ("bos", "eos", "unknown", "seperator", "padding", "cls", "mask")


class LayoutError(ValueError):
    """One sentence: what the header claims that the file does not back."""


def check(arch: str, field: Callable[[str], object], shapes: dict[str, list[int]]) -> None:
    """`field(key)`: a metadata value or None; `shapes`: tensor name -> GGUF dims (ne order:
    the row length first). Raises LayoutError naming the first claim the file cannot back."""
    tokens = field("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise LayoutError("its token list (tokenizer.ggml.tokens) is missing or empty")
    sizes = _sizes(arch, field, len(tokens))
    outer, layer = required(arch, sizes)
    if "output.weight" in shapes:  # else the head is the embedding (tied)
        outer["output.weight"] = outer["token_embd.weight"]
    # block_count is bounded by MAX_SIZES: a name for each claimed layer stays cheap
    needed = {**outer, **{f"blk.{i}.{name}": dims
                          for i in range(sizes["block_count"]) for name, dims in layer.items()}}
    for name, dims in needed.items():
        if name not in shapes:
            raise LayoutError(f"it lacks tensor {name}, one of the {len(needed):,} its header "
                              f"implies (the file holds {len(shapes):,} tensors)")
        if list(shapes[name]) != dims:
            raise LayoutError(f"tensor {name} is {list(shapes[name])} but the header's sizes "
                              f"make it {dims}")
    _tokenizer(field, tokens)


def _sizes(arch: str, field: Callable[[str], object], num_tokens: int) -> dict[str, int]:
    def whole(key: str, limit_of: str, default: int | None = None) -> int:
        value = field(f"{arch}.{key}")
        if value is None and default is not None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise LayoutError(f"its header has no whole number for {arch}.{key}"
                              if value is None else
                              f"its header has {arch}.{key} = {str(value)[:40]}, not a whole "
                              "number")
        if not 0 < value <= MAX_SIZES[limit_of]:
            raise LayoutError(f"its header has {arch}.{key} = {value:,}; it must be between 1 "
                              f"and {MAX_SIZES[limit_of]:,}")
        return value

    hidden = whole("embedding_length", "hidden_size")
    heads = whole("attention.head_count", "num_attention_heads")
    kv_heads = whole("attention.head_count_kv", "num_key_value_heads", default=heads)
    if field(f"{arch}.attention.key_length") is None and hidden % heads:
        raise LayoutError(f"its header has embedding_length {hidden:,}, which {heads} "
                          "attention heads do not divide")
    head_dim = whole("attention.key_length", "head_dim", default=hidden // heads)
    if heads % kv_heads:
        raise LayoutError(f"its header has {heads} attention heads and {kv_heads} KV heads; "
                          "the KV heads must divide the attention heads")
    return {"hidden": hidden, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "ffn": whole("feed_forward_length", "intermediate_size"),
            "vocab": whole("vocab_size", "vocab_size", default=num_tokens),
            "block_count": whole("block_count", "num_hidden_layers")}


def required(arch: str, s: dict[str, int]
             ) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """The tensors the architecture cannot run without, in GGUF dims (ne order): those outside
    the layers, and each layer's (under blk.N.); optional ones (the head when tied, rope
    factors) are not listed."""
    family = families.by_architecture(families.GGUF_ARCHITECTURES[arch])
    h, f = s["hidden"], s["ffn"]
    q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    layer = {"attn_norm.weight": [h], "attn_output.weight": [q, h], "ffn_norm.weight": [h],
             "ffn_down.weight": [f, h]}
    if arch in FUSED:
        layer |= {"attn_qkv.weight": [h, q + 2 * kv], "ffn_up.weight": [h, 2 * f]}
    else:
        layer |= {"attn_q.weight": [h, q], "attn_k.weight": [h, kv], "attn_v.weight": [h, kv],
                  "ffn_gate.weight": [h, f], "ffn_up.weight": [h, f]}
    if family is not None and family.qkv_bias:
        layer |= {"attn_q.bias": [q], "attn_k.bias": [kv], "attn_v.bias": [kv]}
    if family is not None and family.qk_norm:
        layer |= {"attn_q_norm.weight": [s["head_dim"]], "attn_k_norm.weight": [s["head_dim"]]}
    return {"token_embd.weight": [h, s["vocab"]], "output_norm.weight": [h]}, layer


def _tokenizer(field: Callable[[str], object], tokens: list) -> None:
    """Special ids inside the token list; a BPE merge's parts and result in it too (the
    tokenizers library refuses either, with an exception of its own)."""
    for name in SPECIAL_IDS:
        token_id = field(f"tokenizer.ggml.{name}_token_id")
        if isinstance(token_id, int) and not 0 <= token_id < len(tokens):
            raise LayoutError(f"its tokenizer.ggml.{name}_token_id = {token_id:,} is past its "
                              f"{len(tokens):,} tokens")
    merges = field("tokenizer.ggml.merges")
    if field("tokenizer.ggml.model") != "gpt2" or not isinstance(merges, list):
        return
    known = set(tokens)
    for n, merge in enumerate(merges):
        parts = merge.split(" ") if isinstance(merge, str) else []
        if len(parts) != 2 or not all(parts) or any(
                p not in known for p in (*parts, parts[0] + parts[1])):
            raise LayoutError(f"its BPE merge {n:,} ({str(merge)[:40]!r}) is not made of tokens "
                              f"in its {len(tokens):,}-token list")
