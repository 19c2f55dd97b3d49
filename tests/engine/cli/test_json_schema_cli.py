"""`hearth run --json-schema FILE`: the answer follows the schema (its last event says it ended
where the grammar did); a file that is missing, not JSON, not a schema, too large, or a schema
that does not compile is one sentence on stderr and exit 2."""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine.cli import cli
from engine.events import event_from_json
from engine.events.grammar_spec import MAX_SOURCE_CHARS
from tests.engine.cli.test_bad_input import one_error_line

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/engine/conftest.py

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["ok", "n"], "additionalProperties": False}


def run(model, schema_path, *more) -> int:
    return cli.main(["run", "--model", str(model), "--prompt", "hi", "--raw", "--device", "cpu",
                     "--temperature", "0", "--max-new-tokens", "40", "--json-schema",
                     str(schema_path), *more])


def test_the_answer_follows_the_schema(tiny_model, tmp_path, capsys):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA), encoding="utf-8")
    assert run(tiny_model, path, "--json") == 0
    events = [event_from_json(line) for line in capsys.readouterr().out.splitlines()]
    text = "".join(e.text for e in events if e.name == "token")
    assert events[-1].name == "finished" and events[-1].reason == "eos"
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("content, reason", [
    (None, "no such file"),
    ("[1", "not valid JSON"),
    ("[1, 2]", "holds no JSON schema object"),
    (b"\xff\xfe{}", "not UTF-8"),
    (" " * (MAX_SOURCE_CHARS + 1), "larger than"),
    ('{"type": "frog"}', "does not compile: Invalid type: frog"),
])
def test_a_bad_schema_file_is_one_sentence_and_exit_2(tiny_model, tmp_path, capsys, content,
                                                      reason):
    path = tmp_path / "schema.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    assert run(tiny_model, path) == 2
    assert reason in one_error_line(capsys)


def test_a_folder_is_no_schema_file(tiny_model, tmp_path, capsys):
    assert run(tiny_model, tmp_path) == 2
    assert "is not a file" in one_error_line(capsys)
