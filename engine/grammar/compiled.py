"""A grammar compiled against one tokenizer, once: compile(tokenizer, vocab_size, spec) returns a
template matcher that every request with that grammar copies (a copy costs microseconds; the
compile, milliseconds to a second for a large schema). The server compiles a request's grammar
on its own thread before the request reaches the engine, so a schema that does not compile is a
400 there and the step loop finds it cached; the engine's compile is the fallback for the other
front ends (`hearth run`, the worker)."""

from __future__ import annotations

import hashlib
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
_prints: dict[int, tuple[object, str]] = {}  # id(tokenizer) -> (it, its fingerprint)
_tokenizers: dict[tuple[str, int], llguidance.LLTokenizer] = {}
_compiled: OrderedDict[tuple, llguidance.LLMatcher] = OrderedDict()


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


def check(spec: GrammarSpec) -> None:
    """BadRequest where the grammar cannot compile for any tokenizer (before a model loads)."""
    spec.validate()
    error = llguidance.LLMatcher.validate_grammar(grammar_text(spec))
    if error:
        raise BadRequest(f"the {spec.kind.replace('_', ' ')} does not compile: "
                         f"{one_line(error)}")


def fingerprint(tokenizer) -> str:
    """What identifies a tokenizer's vocabulary, whichever copy of it: the server tokenizes with
    a copy of the engine's, and a grammar compiled for one serves the other."""
    with _lock:
        held = _prints.get(id(tokenizer))
        if held is not None and held[0] is tokenizer:
            return held[1]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else repr(sorted(
        tokenizer.get_vocab().items()))
    made = hashlib.sha256(f"{text}|{tokenizer.eos_token_id}".encode()).hexdigest()
    with _lock:
        _prints[id(tokenizer)] = (tokenizer, made)
    return made


def tokenizer_for(tokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's view of a transformers tokenizer, with a mask of vocab_size bits (the
    model's logits, which may be wider than the tokenizer's vocabulary)."""
    key = (fingerprint(tokenizer), vocab_size)
    with _lock:
        held = _tokenizers.get(key)
    if held is None:
        held = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        with _lock:
            _tokenizers[key] = held
    return held


def compile(tokenizer, vocab_size: int, spec: GrammarSpec) -> llguidance.LLMatcher:  # noqa: A001
    """The template matcher of `spec` on this tokenizer (cached; copy it with deep_copy before
    use). BadRequest, with llguidance's reason, where the grammar does not compile."""
    spec.validate()
    key = (fingerprint(tokenizer), vocab_size, spec.kind, spec.source)
    with _lock:
        held = _compiled.get(key)
        if held is not None:
            _compiled.move_to_end(key)
            return held
    lltok = tokenizer_for(tokenizer, vocab_size)
    matcher = llguidance.LLMatcher(lltok, grammar_text(spec), log_level=0)
    if matcher.is_error():
        raise BadRequest(f"the {spec.kind.replace('_', ' ')} does not compile: "
                         f"{one_line(matcher.get_error())}")
    with _lock:
        _compiled[key] = matcher
        while len(_compiled) > CACHE_SIZE:
            _compiled.popitem(last=False)
    return matcher


def one_line(message: str) -> str:
    """An engine's error as one sentence: its lines joined, blanks collapsed, bounded."""
    line = " ".join(message.split()) or "unknown error"
    return line if len(line) <= 300 else line[:297] + "..."
