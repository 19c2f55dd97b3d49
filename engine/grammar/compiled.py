"""A grammar compiled against one tokenizer, once: compile(tokenizer, vocab_size, spec) returns a
template matcher that every request with that grammar copies (a copy costs microseconds; the
compile, milliseconds to a second for a large schema). The server compiles a request's grammar
on its own thread before the request reaches the engine, so a schema that does not compile is a
400 there and the step loop finds it cached; the engine's compile is the fallback for the other
front ends (`hearth run`, the worker)."""

from __future__ import annotations

import hashlib
import json
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
# keywords whose value is a schema, a list of schemas, or a map of names to schemas
_ONE_SCHEMA = ("additionalProperties", "items", "additionalItems", "contains", "not", "if",
               "then", "else", "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# what else may admit or combine an object's properties: an object beside them is left open
_OPENERS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf",
            "anyOf", "oneOf", "$ref", "if", "dependentSchemas")
MAX_CLOSED_DEPTH = 64  # deeper objects keep JSON Schema's default

_lock = threading.Lock()
_prints: dict[int, tuple[object, str]] = {}  # id(tokenizer) -> (it, its fingerprint)
_tokenizers: dict[tuple[str, int], llguidance.LLTokenizer] = {}
_compiled: OrderedDict[tuple, llguidance.LLMatcher] = OrderedDict()


def grammar_text(spec: GrammarSpec) -> str:
    """The spec in llguidance's grammar form (no tokenizer yet)."""
    try:
        if spec.kind == "json_schema":
            schema = json.loads(spec.source)
            return llguidance.LLMatcher.grammar_from_json_schema(
                closed_objects(schema) if isinstance(schema, dict) else spec.source,
                defaults=JSON_OPTIONS)
        if spec.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema(JSON_OBJECT,
                                                                 defaults=JSON_OPTIONS)
        if spec.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec.source)
        return llguidance.LLMatcher.grammar_from_lark(spec.source)
    except ValueError as e:
        raise BadRequest(f"the {spec.kind.replace('_', ' ')} does not compile: {e}") from None


def closed_objects(schema, close: bool = True, depth: int = 0):
    """`schema` with each object that lists its properties and says nothing of others closed to
    them (additionalProperties false), as llama.cpp's and XGrammar's grammars read a schema:
    the answer still validates against the schema as given, and a model does not wander into
    keys nobody asked for (`llm --schema` sends none of its own; a small model that starts one
    rarely stops). An allOf's branches stay open: each holds only a part of one object."""
    if not isinstance(schema, dict) or depth > MAX_CLOSED_DEPTH:
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed_objects(v, True, depth + 1) for k, v in out[key].items()}
    for key in _ONE_SCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = closed_objects(out[key], True, depth + 1)
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(s, True, depth + 1) for s in out[key]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [closed_objects(s, False, depth + 1) for s in out["allOf"]]
    if close and isinstance(out.get("properties"), dict) and not any(k in out for k in _OPENERS):
        out["additionalProperties"] = False
    return out


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


def special_token(tokenizer, vocab_size: int, text: str) -> int | None:
    """The id of the token whose text is `text` where llguidance holds it special (added
    tokens: a grammar names them by id, never by their text), else None."""
    token = tokenizer.convert_tokens_to_ids(text)
    if not isinstance(token, int) or not 0 <= token < vocab_size \
            or tokenizer.convert_ids_to_tokens(token) != text:
        return None
    return token if tokenizer_for(tokenizer, vocab_size).is_special_token(token) else None


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
