"""A grammar compiled against one tokenizer, once: compile(tokenizer, vocab_size, spec) returns a
template matcher that every request with that grammar copies (a copy costs microseconds; the
compile, milliseconds to a second for a large schema). The server compiles a request's grammar
on its own thread before the request reaches the engine, so a schema that does not compile is a
400 there and the step loop finds it cached; the engine's compile is the fallback for the other
front ends (`hearth run`, the worker)."""

from __future__ import annotations

import threading
from collections import OrderedDict

import llguidance
import llguidance.hf

from engine.events.grammar_spec import GrammarSpec
from engine.events.requests import BadRequest

CACHE_SIZE = 64  # compiled grammars kept (least recently used goes first)
JSON_OBJECT = {"type": "object"}  # json_object: any JSON object, as OpenAI's mode asks
# compact JSON (no blanks between tokens): with blanks allowed, a small model can write newlines
# until its token limit, an answer that never finishes
JSON_OPTIONS = {"whitespace_flexible": False}

_lock = threading.Lock()
_tokenizers: dict[tuple[int, int], tuple[object, llguidance.LLTokenizer]] = {}
_compiled: OrderedDict[tuple, tuple[object, llguidance.LLMatcher]] = OrderedDict()


def grammar_text(spec: GrammarSpec) -> str:
    """The spec in llguidance's grammar form (no tokenizer yet)."""
    try:
        if spec.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(spec.source,
                                                                 defaults=JSON_OPTIONS)
        if spec.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema(JSON_OBJECT,
                                                                 defaults=JSON_OPTIONS)
        if spec.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec.source)
        return llguidance.LLMatcher.grammar_from_lark(spec.source)
    except ValueError as e:
        raise BadRequest(f"the {spec.kind.replace('_', ' ')} does not compile: {e}") from None


def tokenizer_for(tokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's view of a transformers tokenizer, with a mask of vocab_size bits (the
    model's logits, which may be wider than the tokenizer's vocabulary)."""
    key = (id(tokenizer), vocab_size)
    with _lock:
        held = _tokenizers.get(key)
        if held is not None and held[0] is tokenizer:
            return held[1]
    made = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
    with _lock:
        _tokenizers[key] = (tokenizer, made)
    return made


def compile(tokenizer, vocab_size: int, spec: GrammarSpec) -> llguidance.LLMatcher:  # noqa: A001
    """The template matcher of `spec` on this tokenizer (cached; copy it with deep_copy before
    use). BadRequest, with llguidance's reason, where the grammar does not compile."""
    spec.validate()
    key = (id(tokenizer), vocab_size, spec.kind, spec.source)
    with _lock:
        held = _compiled.get(key)
        if held is not None and held[0] is tokenizer:
            _compiled.move_to_end(key)
            return held[1]
    lltok = tokenizer_for(tokenizer, vocab_size)
    matcher = llguidance.LLMatcher(lltok, grammar_text(spec), log_level=0)
    if matcher.is_error():
        raise BadRequest(f"the {spec.kind.replace('_', ' ')} does not compile: "
                         f"{one_line(matcher.get_error())}")
    with _lock:
        _compiled[key] = (tokenizer, matcher)
        while len(_compiled) > CACHE_SIZE:
            _compiled.popitem(last=False)
    return matcher


def one_line(message: str) -> str:
    """An engine's error as one sentence (the first line, bounded)."""
    line = (message.strip().splitlines() or ["unknown error"])[0]
    return line[:300]
