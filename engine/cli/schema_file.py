"""`hearth run --json-schema FILE`: the file read as a JSON schema for the answer (a grammar the
sampler holds it to, engine/grammar/). Bad input is one sentence: a file that is not there, not
a file, too large, not UTF-8, not JSON, not a schema object, or a schema that does not
compile (checked before the model loads)."""

from __future__ import annotations

import json
from pathlib import Path

from engine.events import BadRequest, GrammarSpec
from engine.events.grammar_spec import MAX_SOURCE_CHARS
from engine.grammar import compiled


def read(path: str) -> GrammarSpec:
    where = Path(path).expanduser()
    try:
        where = where.resolve(strict=True)
    except (OSError, RuntimeError):
        raise BadRequest(f"--json-schema {path}: no such file") from None
    if not where.is_file():
        raise BadRequest(f"--json-schema {path} is not a file")
    try:
        if where.stat().st_size > MAX_SOURCE_CHARS:
            raise BadRequest(f"--json-schema {path} is larger than {MAX_SOURCE_CHARS:,} bytes")
        schema = json.loads(where.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BadRequest(f"--json-schema {path} is not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise BadRequest(f"--json-schema {path} is nested too deeply") from None
    except ValueError as e:
        raise BadRequest(f"--json-schema {path} is not valid JSON: {e}") from None
    except OSError as e:
        raise BadRequest(f"cannot read --json-schema {path}: {e.strerror or e}") from None
    if not isinstance(schema, (dict, bool)):
        raise BadRequest(f"--json-schema {path} holds no JSON schema object")
    spec = GrammarSpec.from_schema(schema)
    compiled.check(spec)  # before the model loads
    return spec
