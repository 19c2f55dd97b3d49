"""OpenAI's response_format as a grammar: {"type": "text"} (none), {"type": "json_object"} (any
JSON object) or {"type": "json_schema", "json_schema": {"name", "schema", "strict",
"description"}}. `strict` is taken either way: the grammar holds the answer to the schema
whether or not a client asks it to (OpenAI's strict mode). The server compiles the grammar
before the request reaches the engine (server/prompts.py), so a schema that does not compile is
a 400 there with the grammar engine's reason."""

from __future__ import annotations

import json

from engine.events import BadRequest, GrammarSpec


def spec_of(fmt: dict | None) -> GrammarSpec | None:
    """The grammar a response_format asks for (None: plain text); BadRequest where malformed."""
    if not fmt:
        return None
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_object")
    if kind != "json_schema":
        raise BadRequest(f"response_format.type {str(kind)[:40]!r} is not one of text, "
                         "json_object, json_schema")
    body = fmt.get("json_schema")
    if not isinstance(body, dict):
        raise BadRequest("response_format json_schema needs a json_schema object holding a "
                         "schema")
    schema = body.get("schema", {})
    if not isinstance(schema, (dict, bool)):
        raise BadRequest("response_format.json_schema.schema must be a JSON schema object")
    if body.get("strict") is not None and type(body["strict"]) is not bool:
        raise BadRequest("response_format.json_schema.strict is true or false")
    return GrammarSpec("json_schema", json.dumps(schema))
