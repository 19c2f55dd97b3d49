"""Requests as JSON lines: what the app writes to the worker's stdin and the worker reads back,
with every field's type checked as sent (the values' ranges are the requests' own `validate()`).
"""

from __future__ import annotations

import dataclasses
import json
import math

from engine.events.grammar_spec import GrammarSpec
from engine.events.requests import REQUESTS, BadRequest, SamplingParams, short_repr


def request_to_json(req) -> str:
    body = dataclasses.asdict(req)
    return json.dumps({"command": req.command, **body}, ensure_ascii=False)


MAX_NESTING = 32  # a message is 3 levels deep; json itself gives up near 1,000 (RecursionError)


def request_from_json(line: str | bytes):
    """Parse one command line, whatever it holds; raises BadRequest with a one-sentence reason
    that names the field at fault. Field types are checked here (a JSON command is taken as
    sent: 1.5 is no top_k, "5" no context); the values' ranges are `validate()`'s business."""
    if isinstance(line, (bytes, bytearray)):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadRequest(f"command is not valid UTF-8 (byte {e.object[e.start]:#04x} at "
                             f"offset {e.start})") from None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadRequest(f"command is not valid JSON: {e.msg}") from None
    except RecursionError:
        raise BadRequest("command is nested too deeply to read") from None
    except ValueError:  # JSON is fine but Python refuses the integer: over 4,300 digits
        raise BadRequest("command holds a number with too many digits") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("command"), str) or (
            obj["command"] not in REQUESTS):
        raise BadRequest(f"unknown command; expected an object whose \"command\" is one of "
                         f"{', '.join(REQUESTS)}")
    cls = REQUESTS[obj.pop("command")]
    _check_text_and_depth(obj, cls.command)
    return _build(cls, obj, cls.command, "")


def _build(cls, obj: dict, command: str, prefix: str):
    kinds = _FIELD_KINDS[cls]
    unknown = set(obj) - set(kinds)
    if unknown:
        names = ", ".join(sorted(short_repr(n) for n in unknown)[:5])
        raise BadRequest(f"unknown field(s) for {command}: {names}")
    args = {name: _convert(command, prefix + name, *kinds[name], value)
            for name, value in obj.items()}
    try:
        return cls(**args)
    except TypeError as e:  # unreachable with the checks above; kept as the contract's floor
        raise BadRequest(f"malformed {command} command: {e}") from None


def _convert(command: str, where: str, base: str, optional: bool, value):
    if value is None:
        if optional:
            return None
        if base in _NULL_IS_EMPTY:  # what older clients send for "none"
            return _NULL_IS_EMPTY[base]()
    elif base in _NESTED:
        if isinstance(value, dict):
            return _build(_NESTED[base], value, command, where + ".")
    else:
        ok, convert, _ = _KINDS[base]
        if ok(value):
            return convert(value)
    wanted = "an object" if base in _NESTED else _KINDS[base][2]
    raise BadRequest(f"{command} field {where!r} must be {wanted}{' or null' * optional}, "
                     f"got {_describe(value)}")


def _is_int(v) -> bool:
    return type(v) is int and abs(v) <= 2**64  # not bool, not 2.0; no 4,000-digit counts


def _is_number(v) -> bool:
    if type(v) is int:
        return abs(v) <= 2**64  # a float of it is finite
    return type(v) is float and math.isfinite(v)  # json reads NaN and Infinity too


def _list_of(ok):
    return lambda v: isinstance(v, list) and all(ok(x) for x in v)


_KINDS = {  # annotation -> (accepts the JSON value, converts it, what it must be)
    "str": (lambda v: isinstance(v, str), str, "a string"),
    "int": (_is_int, int, "a whole number of at most 20 digits"),
    "float": (_is_number, float, "a finite number"),
    "bool": (lambda v: type(v) is bool, bool, "true or false"),
    "tuple[str, ...]": (_list_of(lambda v: isinstance(v, str)), tuple, "a list of strings"),
    "tuple[int, ...]": (_list_of(_is_int), tuple, "a list of whole numbers"),
    "tuple[dict, ...]": (_list_of(lambda v: isinstance(v, dict)), tuple, "a list of objects"),
    "tuple[tuple[int, float], ...]": (
        _list_of(lambda v: isinstance(v, list) and len(v) == 2 and _is_int(v[0])
                 and _is_number(v[1])),
        lambda v: tuple((int(i), float(b)) for i, b in v), "a list of [token id, bias] pairs"),
}
_NULL_IS_EMPTY = {"tuple[str, ...]": tuple, "SamplingParams": SamplingParams}
_NESTED = {"SamplingParams": SamplingParams, "GrammarSpec": GrammarSpec}  # objects in a request


def _field_kinds(cls) -> dict[str, tuple[str, bool]]:
    """name -> (base annotation, optional), from the dataclass's own (string) annotations."""
    kinds = {}
    for f in dataclasses.fields(cls):
        parts = [p.strip() for p in str(f.type).split("|")]
        base = [p for p in parts if p != "None"]
        if len(base) != 1 or (base[0] not in _KINDS and base[0] not in _NESTED):
            raise TypeError(f"{cls.__name__}.{f.name}: no JSON check for {f.type!r}")
        kinds[f.name] = (base[0], "None" in parts)
    return kinds


_FIELD_KINDS = {cls: _field_kinds(cls) for cls in (*REQUESTS.values(), *_NESTED.values())}


def _describe(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        text = short_repr(v)
        return text if text.startswith("a ") else f"the number {text}"
    if isinstance(v, str):
        return f"the string {short_repr(v)}"
    return "a list" if isinstance(v, list) else "an object"


def _check_text_and_depth(obj: dict, command: str) -> None:
    """Refuse lone surrogates (JSON escapes can carry them; no tokenizer or pipe takes them) and
    nesting past MAX_NESTING, naming the field; iterative, so depth cannot overflow the stack."""
    stack = [(v, str(k), 1) for k, v in obj.items()] + [(k, str(k), 1) for k in obj]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_NESTING:
            raise BadRequest(f"{command} field {short_repr(where)} is nested more than "
                             f"{MAX_NESTING} levels deep")
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(f"{command} field {short_repr(where)} holds a lone surrogate "
                                 "(\\ud800-\\udfff), which is not text") from None
        elif isinstance(value, list):
            stack.extend((v, where, depth + 1) for v in value)
        elif isinstance(value, dict):
            stack.extend((v, where, depth + 1) for v in value.values())
            stack.extend((k, where, depth + 1) for k in value)
