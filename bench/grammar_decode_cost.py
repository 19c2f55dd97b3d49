"""What does a grammar cost a decode on the CPU? SmolLM2 (or MODEL_FOLDER), a nested schema:
decode tokens/s at batch 1 and 8, constrained against unconstrained (greedy, same prompt), and
the schema's compile cold and cached on the model's tokenizer.

    python bench/grammar_decode_cost.py MODEL_FOLDER [--new-tokens N]
"""

from __future__ import annotations

import argparse
import json
import threading
import time

SCHEMA = {"type": "object", "properties": {
    "people": {"type": "array", "minItems": 8, "maxItems": 8, "items": {
        "type": "object", "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user", "guest"]}},
        "required": ["name", "age", "role"], "additionalProperties": False}}},
    "required": ["people"], "additionalProperties": False}


def batch_rate(session, reqs) -> tuple[float, int]:
    """Aggregate decode tokens/s of reqs submitted at once to an Engine over session."""
    from engine.events import Failed, Finished, Token
    from engine.service.engine import Engine

    engine = Engine()
    engine.session = session
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    done, tokens = threading.Semaphore(0), [0]

    def sink(e):
        if isinstance(e, Token):
            tokens[0] += len(e.token_ids)
        if isinstance(e, Finished | Failed):
            done.release()
    t0 = time.perf_counter()
    for i, r in enumerate(reqs):
        engine.submit(r, sink, request_id=f"q{i}")
    for _ in reqs:
        done.acquire()
    wall = time.perf_counter() - t0
    engine.stop()
    thread.join(30)
    return tokens[0] / wall, tokens[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--new-tokens", type=int, default=96)
    a = ap.parse_args()
    from engine.events import GenerateRequest, GrammarSpec, LoadRequest, SamplingParams
    from engine.generate.session import Session
    from engine.grammar import compiled

    session = Session.load(LoadRequest(a.model, device="cpu", context=1024))
    lm = session.lm
    spec = GrammarSpec.from_schema(SCHEMA)
    vocab = lm.model.config.vocab_size
    t0 = time.perf_counter()
    compiled.compile(lm.tokenizer, vocab, spec)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled.compile(lm.tokenizer, vocab, spec).deep_copy()
    cached = time.perf_counter() - t0
    rows = {"compile_cold_ms": round(cold * 1e3, 2), "compile_cached_ms": round(cached * 1e3, 3)}
    greedy = SamplingParams(temperature=0.0)
    for n in (1, 8):
        for name, grammar in (("plain", None), ("grammar", spec)):
            reqs = [GenerateRequest(prompt=f"Eight people as JSON ({i}):", raw=True,
                                    max_new_tokens=a.new_tokens, sampling=greedy,
                                    ignore_eos=grammar is None, grammar=grammar)
                    for i in range(n)]
            rate, tokens = batch_rate(session, reqs)
            rows[f"batch{n}_{name}_tok_s"] = round(rate, 2)
            rows[f"batch{n}_{name}_tokens"] = tokens
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
