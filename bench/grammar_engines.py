"""Which grammar engine does Hearth's constrained decoding use: llguidance or XGrammar?

Both compile the same JSON schemas (and json_object) against one tokenizer (SmolLM2's by default)
and walk the same answers token by token: compile time cold (first compile in a fresh compiler /
matcher) and cached (the same grammar again: llguidance copies a compiled matcher, XGrammar's
compiler cache returns the compiled grammar), and mask time per token (the next-token bitmask
filled for every position of a valid answer, then the token consumed). CPU only.

    python bench/grammar_engines.py MODEL_FOLDER [--repeats N] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

SCHEMAS = {
    "nested": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20},
        "address": {"type": "object", "properties": {
            "street": {"type": "string", "maxLength": 30}, "zip": {"type": "integer"}},
            "required": ["street", "zip"]}},
        "required": ["name", "address"]},
    "array": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                 "minItems": 1, "maxItems": 4}}, "required": ["tags"]},
    "enum": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
        "required": ["color", "ok"]},
    "bounded": {"type": "object", "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["age", "score"]},
    "wide": {"type": "object", "properties": {
        f"field_{i}": {"type": ["string", "integer", "null"]} for i in range(24)},
        "required": [f"field_{i}" for i in range(0, 24, 3)]},
}
ANSWERS = {
    "nested": {"name": "Ada Lovelace", "address": {"street": "12 St James Square", "zip": 10115}},
    "array": {"tags": ["alpha", "beta", "gamma"]},
    "enum": {"color": "green", "ok": True},
    "bounded": {"age": 36, "score": 0.75},
    "wide": {f"field_{i}": (i if i % 2 else f"v{i}") for i in range(0, 24, 3)},
}


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def llguidance_run(tok, n_vocab: int, repeats: int) -> dict:
    import llguidance
    import llguidance.hf
    import llguidance.torch as llt

    t0 = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=n_vocab)
    setup = time.perf_counter() - t0
    cold, cached, mask = [], [], []
    for name, schema in SCHEMAS.items():
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        t0 = time.perf_counter()
        template = llguidance.LLMatcher(lltok, grammar)
        assert not template.is_error(), template.get_error()
        cold.append(time.perf_counter() - t0)
        for _ in range(repeats):
            t0 = time.perf_counter()
            m = template.deep_copy()
            cached.append(time.perf_counter() - t0)
        ids = tok.encode(json.dumps(ANSWERS[name]), add_special_tokens=False)
        bitmask = llt.allocate_token_bitmask(1, lltok.vocab_size)
        for t in ids:
            t0 = time.perf_counter()
            llt.fill_next_token_bitmask(m, bitmask, 0)
            mask.append(time.perf_counter() - t0)
            assert m.consume_token(t), (name, m.get_error())
    return {"setup": setup, "cold": cold, "cached": cached, "mask": mask}


def xgrammar_run(tok, n_vocab: int, repeats: int) -> dict:
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=n_vocab)
    compiler = xgr.GrammarCompiler(info, cache_enabled=True)
    setup = time.perf_counter() - t0
    cold, cached, mask = [], [], []
    for name, schema in SCHEMAS.items():
        text = json.dumps(schema)
        t0 = time.perf_counter()
        compiled = compiler.compile_json_schema(text)
        cold.append(time.perf_counter() - t0)
        for _ in range(repeats):
            t0 = time.perf_counter()
            compiled = compiler.compile_json_schema(text)
            m = xgr.GrammarMatcher(compiled)
            cached.append(time.perf_counter() - t0)
        ids = tok.encode(json.dumps(ANSWERS[name]), add_special_tokens=False)
        bitmask = xgr.allocate_token_bitmask(1, n_vocab)
        for t in ids:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(bitmask, 0)
            mask.append(time.perf_counter() - t0)
            assert m.accept_token(t), name
    return {"setup": setup, "cold": cold, "cached": cached, "mask": mask}


def summary(r: dict) -> dict:
    mask = sorted(r["mask"])
    return {"tokenizer_setup_ms": ms(r["setup"]),
            "compile_cold_ms_mean": ms(statistics.mean(r["cold"])),
            "compile_cold_ms_max": ms(max(r["cold"])),
            "compile_cached_ms_mean": ms(statistics.mean(r["cached"])),
            "mask_us_mean": round(statistics.mean(mask) * 1e6, 1),
            "mask_us_p50": round(mask[len(mask) // 2] * 1e6, 1),
            "mask_us_p99": round(mask[int(len(mask) * 0.99)] * 1e6, 1),
            "mask_us_max": round(mask[-1] * 1e6, 1), "tokens": len(mask)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model)
    n_vocab = AutoConfig.from_pretrained(a.model).vocab_size
    rows = {}
    for name, run in (("llguidance", llguidance_run), ("xgrammar", xgrammar_run)):
        try:
            rows[name] = summary(run(tok, n_vocab, a.repeats))
        except ImportError as e:
            rows[name] = {"error": f"not installed: {e}"}
    if a.json:
        print(json.dumps(rows))
        return
    keys = list(next(v for v in rows.values() if "error" not in v))
    print("| engine | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(str(row.get(k, "-")) for k in keys) + " |")


if __name__ == "__main__":
    main()
