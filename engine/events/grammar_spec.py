"""What a constrained request asks its answer to be: a JSON schema, any JSON object, a regular
expression or a Lark grammar (engine/grammar/ compiles it against the model's tokenizer). Pure
data; the server's response_format and `hearth run --json-schema` make one."""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine.events.requests import BadRequest

KINDS = ("json_schema", "json_object", "regex", "lark")
MAX_SOURCE_CHARS = 256 * 1024  # a schema or grammar longer than this is refused, not compiled


@dataclass(frozen=True)
class GrammarSpec:
    """kind: one of KINDS; source: the schema as JSON text, the regex or the Lark text ("" for
    json_object)."""

    kind: str
    source: str = ""

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise BadRequest(f"unknown grammar kind {self.kind!r}; choose one of "
                             f"{', '.join(KINDS)}")
        if not isinstance(self.source, str) or len(self.source) > MAX_SOURCE_CHARS:
            raise BadRequest(f"a grammar is text of at most {MAX_SOURCE_CHARS:,} characters")
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.source)
            except ValueError as e:
                raise BadRequest(f"the JSON schema is not valid JSON: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise BadRequest("a JSON schema is an object")

    @classmethod
    def from_schema(cls, schema) -> GrammarSpec:
        """A json_schema spec from a parsed schema (its JSON text, keys in order)."""
        return cls("json_schema", json.dumps(schema))
