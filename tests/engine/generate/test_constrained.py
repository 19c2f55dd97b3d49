"""Constrained decoding end to end (engine/grammar/ through both generation loops): on the tiny
random-weights model (whose unconstrained output is never JSON) and on SmolLM2, requests over
five schemas (nested objects, arrays, enums, required fields, bounded numbers), greedy and
seeded, batched: every answer that ends at its grammar ("eos") validates with jsonschema, and
one cut at its token limit is never valid; a batch of rows with different schemas and with none
gives each row what it gives alone (fp32 greedy and seeded); preempted and recomputed
constrained rows keep their grammar's state; a constrained request does not speculate."""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine.events import Finished, GenerateRequest, GrammarSpec, LoadRequest, SamplingParams
from engine.generate.session import Session
from tests.engine.generate.test_batch_run import Run, alone

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/engine/conftest.py

SHORT = {"type": "string", "maxLength": 8}
SCHEMAS = [
    {"type": "object", "properties": {  # nested objects
        "name": SHORT, "where": {"type": "object", "properties": {
            "city": SHORT, "zip": {"type": "integer", "minimum": 0, "maximum": 99999}},
            "required": ["city", "zip"], "additionalProperties": False}},
     "required": ["name", "where"], "additionalProperties": False},
    {"type": "object", "properties": {  # arrays
        "tags": {"type": "array", "items": SHORT, "minItems": 1, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {  # enums
        "color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
     "required": ["color", "ok"], "additionalProperties": False},
    {"type": "object", "properties": {  # required fields among optional ones
        "id": {"type": "integer", "minimum": 1, "maximum": 9}, "note": SHORT},
     "required": ["id"], "additionalProperties": False},
    {"type": "object", "properties": {  # bounded numbers
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "score": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["age", "score"], "additionalProperties": False},
]


def constrained(i: int, schema: dict | None, prompt: str = "Answer in JSON:", **kw):
    """Even i: greedy; odd: seeded sampling."""
    sampling = (SamplingParams(temperature=0.0) if i % 2 == 0 else
                SamplingParams(temperature=0.8, top_p=0.95, seed=40 + i))
    grammar = GrammarSpec.from_schema(schema) if schema is not None else None
    return GenerateRequest(**{"prompt": prompt, "raw": True, "max_new_tokens": 96,
                              "sampling": sampling, "grammar": grammar, **kw})


def texts_and_reasons(run: Run, n: int) -> list[tuple[str, str]]:
    out = []
    for i in range(n):
        end = run.end(f"r{i}")
        assert isinstance(end, Finished), end
        out.append(("".join(e.text for e in run.events[f"r{i}"] if hasattr(e, "text")),
                    end.reason))
    return out


def valid(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def check_answers(answers, schemas) -> int:
    """Every "eos" answer validates; no "max_tokens" one does -> how many ended at eos."""
    for (text, reason), schema in zip(answers, schemas, strict=True):
        assert reason in ("eos", "max_tokens"), reason
        assert valid(text, schema) == (reason == "eos"), (text, reason)
    return sum(reason == "eos" for _, reason in answers)


@pytest.fixture(scope="module")
def tiny(tiny_models):
    return Session.load(LoadRequest(str(tiny_models["llama"]), device="cpu", context=512))


def test_random_weights_write_valid_json_batched_as_alone(tiny):
    schemas = [SCHEMAS[i % 5] for i in range(10)]
    reqs = [constrained(i, s) for i, s in enumerate(schemas)]
    reqs.append(constrained(10, None, max_new_tokens=20))  # a row with no grammar
    reqs.append(constrained(11, None, max_new_tokens=20))
    expected = alone(tiny, reqs)
    run = Run(tiny)
    try:
        for i, r in enumerate(reqs):
            run.submit(f"r{i}", r)
        got = [run.tokens(f"r{i}") for i in range(len(reqs))]
        answers = texts_and_reasons(run, len(reqs))
    finally:
        run.close()
    assert got == expected  # each row as alone, grammar or none, greedy or seeded
    assert max(run.engine.batch.rows_seen) >= 6
    assert check_answers(answers[:10], schemas) >= 9
    assert not any(valid(text, {"type": "object"}) for text, _ in answers[10:])


def test_a_length_cut_answer_is_never_reported_valid(tiny):
    events = list(tiny.generate(constrained(0, SCHEMAS[0], max_new_tokens=6)))
    text = "".join(e.text for e in events if hasattr(e, "text"))
    assert events[-1].reason == "max_tokens" and not valid(text, SCHEMAS[0])


def test_json_object_and_a_regex(tiny):
    def answer(spec):
        events = list(tiny.generate(GenerateRequest(prompt="x", raw=True, max_new_tokens=40,
                                                    grammar=spec)))
        return "".join(e.text for e in events if hasattr(e, "text")), events[-1].reason

    text, reason = answer(GrammarSpec("regex", "[0-9]{3}-[a-z]{2}"))
    assert reason == "eos" and len(text) == 6 and text[:3].isdigit() and text[3] == "-", text
    text, reason = answer(GrammarSpec("json_object"))  # random weights: a key may never end
    assert text.startswith("{") and valid(text, {"type": "object"}) == (reason == "eos"), text


def test_a_constrained_request_does_not_speculate(tiny):
    plain = constrained(0, SCHEMAS[2])
    asked = constrained(0, SCHEMAS[2], prompt_lookup=True)
    events = list(tiny.generate(asked))
    assert events[-1].stats.proposed_draft_tokens == 0
    assert alone(tiny, [asked]) == alone(tiny, [plain])


def test_preempted_constrained_rows_keep_their_grammar(tiny_models):
    s = Session.load(LoadRequest(str(tiny_models["qwen2"]), device="cpu", context=128,
                                 kv_tokens=16))  # 8 blocks for 6 requests of 4-6 each
    schemas = [SCHEMAS[i % 5] for i in range(6)]
    reqs = [constrained(i, sc, max_new_tokens=60) for i, sc in enumerate(schemas)]
    expected = alone(s, reqs)
    run = Run(s)
    try:
        for i, r in enumerate(reqs):
            run.submit(f"r{i}", r)
        got = [run.tokens(f"r{i}") for i in range(6)]
        answers = texts_and_reasons(run, 6)
    finally:
        run.close()
    assert run.engine.batch.scheduler.num_preemptions > 0
    assert got == expected
    check_answers(answers, schemas)


def test_smollm2_answers_validate_batched(smollm2):
    s = Session.load(LoadRequest(str(smollm2), device="cpu", context=512))
    prompts = ["A person as JSON:", "Some tags as JSON:", "A color as JSON:", "An id as JSON:",
               "A player as JSON:"]
    schemas = SCHEMAS
    reqs = [constrained(i, sc, prompt=prompts[i], max_new_tokens=64)
            for i, sc in enumerate(schemas)]
    run = Run(s)
    try:
        for i, r in enumerate(reqs):
            run.submit(f"r{i}", r)
        answers = texts_and_reasons(run, len(reqs))
    finally:
        run.close()
    assert check_answers(answers, schemas) == len(reqs)  # bounded strings: every one finishes
