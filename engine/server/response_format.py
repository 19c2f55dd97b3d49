"""OpenAI's response_format as the engine's grammar: {"type": "text"} (none), {"type":
"json_object"} (any JSON object) or {"type": "json_schema", "json_schema": {"name", "schema",
"strict", "description"}}. The grammar is compiled here, on the tokenizer's thread, before the
request reaches the engine (the engine finds it cached), so a schema that does not compile is a
400 with the grammar engine's reason. `strict` is accepted either way: the grammar always holds
the answer to the schema (OpenAI's strict mode; a non-strict schema is held no less)."""

from __future__ import annotations

import json

from engine.events import BadRequest, GrammarSpec
from engine.grammar import compiled
from engine.server.errors import bad_request
from engine.server.model_view import ModelView

PARAM = "response_format"


def spec_of(fmt: dict | None) -> GrammarSpec | None:
    """The grammar a response_format asks for (None: plain text); a 400 where it is malformed."""
    if not fmt:
        return None
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_object")
    if kind != "json_schema":
        raise bad_request(f"response_format.type {str(kind)[:40]!r} is not one of text, "
                          "json_object, json_schema", f"{PARAM}.type")
    body = fmt.get("json_schema")
    if not isinstance(body, dict):
        raise bad_request("response_format json_schema needs a json_schema object holding a "
                          "schema", f"{PARAM}.json_schema")
    schema = body.get("schema", {})
    if not isinstance(schema, (dict, bool)):
        raise bad_request("response_format.json_schema.schema must be a JSON schema object",
                          f"{PARAM}.json_schema.schema")
    if "strict" in body and body["strict"] is not None and type(body["strict"]) is not bool:
        raise bad_request("response_format.json_schema.strict is true or false",
                          f"{PARAM}.json_schema.strict")
    return GrammarSpec("json_schema", json.dumps(schema))


async def grammar(fmt: dict | None, model: ModelView) -> GrammarSpec | None:
    """spec_of(fmt), compiled against the model's tokenizer (a 400 where it cannot be)."""
    spec = spec_of(fmt)
    if spec is None:
        return None
    try:
        await model.run(compiled.compile, model.tok, model.vocab_size, spec)
    except BadRequest as e:
        raise bad_request(str(e), PARAM) from None
    return spec
