"""Structured output and tool calls measured through a running `hearth serve`: requests over
five JSON schemas (nested objects, arrays, enums, required fields, bounded numbers; every string
bounded), and tool_choice required and named over tools of bounded parameters. Each answer is
checked by jsonschema, an independent validator: an answer that finishes `stop` must validate;
one that finishes `length` is never counted valid (the column "length, yet valid" says whether
the server called a whole answer cut short: it must stay 0). The bench script
(bench/structured_output.py) and a CI test of a few requests share this code.
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

SCHEMAS = {
    "nested objects": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 16},
            "address": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 16},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False}},
            "required": ["name", "address"], "additionalProperties": False}},
        "required": ["user"], "additionalProperties": False},
    "arrays": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                 "minItems": 1, "maxItems": 4},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100},
                   "maxItems": 5}},
        "required": ["tags", "scores"], "additionalProperties": False},
    "enums": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "size": {"enum": ["S", "M", "L", "XL"]},
        "in_stock": {"type": "boolean"}},
        "required": ["color", "size", "in_stock"], "additionalProperties": False},
    "required fields": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 99999},
        "title": {"type": "string", "maxLength": 24},
        "note": {"type": "string", "maxLength": 24},
        "done": {"type": "boolean"}},
        "required": ["id", "title", "done"], "additionalProperties": False},
    "bounded numbers": {"type": "object", "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "temperature": {"type": "number", "minimum": -40, "maximum": 50},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
        "required": ["age", "temperature", "ratio"], "additionalProperties": False},
}
PROMPTS = {
    "nested objects": "Give a user with a name and an address (city, 5-digit zip) as JSON.",
    "arrays": "List up to four tags and up to five scores from 0 to 100 as JSON.",
    "enums": "Describe a shirt: its color, size and whether it is in stock, as JSON.",
    "required fields": "Write a to-do item as JSON with an id, a title and whether it is done.",
    "bounded numbers": "A person's age, today's temperature in C and a ratio, as JSON.",
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "set_alarm", "description": "Set an alarm.",
        "parameters": {"type": "object", "properties": {
            "hour": {"type": "integer", "minimum": 0, "maximum": 23},
            "minute": {"type": "integer", "minimum": 0, "maximum": 59},
            "label": {"type": "string", "maxLength": 16}},
            "required": ["hour", "minute"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search notes.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "maxLength": 24},
            "tags": {"type": "array", "items": {"enum": ["work", "home", "urgent"]},
                     "maxItems": 3}},
            "required": ["query"], "additionalProperties": False}}},
]
TOOL_ASK = "Set an alarm for seven, check the weather in Paris, or search my notes."
CHOICES = ("required", *({"type": "function", "function": {"name": t["function"]["name"]}}
                         for t in TOOLS))


def model_id(url: str) -> str:
    """The id the server at `url` lists for its model."""
    import httpx

    return httpx.get(f"{url}/models", timeout=60).json()["data"][0]["id"]


def _post(url: str, body: dict, timeout: float) -> dict:
    import httpx

    r = httpx.post(f"{url}/chat/completions", json={"model": model_id(url), **body},
                   timeout=timeout)
    r.raise_for_status()
    return r.json()["choices"][0]


def _valid(instance_text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(instance_text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def schema_answer(url: str, name: str, seed: int, max_tokens: int, temperature: float,
                  timeout: float = 600) -> dict:
    """One request of schema `name` -> {"schema", "finish", "valid", "length_valid"}."""
    choice = _post(url, {
        "messages": [{"role": "user", "content": PROMPTS[name]}],
        "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
        "response_format": {"type": "json_schema", "json_schema": {
            "name": name.replace(" ", "_"), "schema": SCHEMAS[name], "strict": True}}}, timeout)
    finish, text = choice["finish_reason"], choice["message"]["content"] or ""
    ok = _valid(text, SCHEMAS[name])
    return {"schema": name, "finish": finish, "valid": finish == "stop" and ok,
            "length_valid": finish == "length" and ok, "text": text}


def tool_answer(url: str, choice, seed: int, max_tokens: int, temperature: float,
                parallel: bool = True, timeout: float = 600) -> dict:
    """One request under tool_choice `choice` -> {"choice", "finish", "calls", "valid"}: valid
    where it finished with calls and each parses and validates against its function's
    parameters (and names the function a named choice asks)."""
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    got = _post(url, {
        "messages": [{"role": "user", "content": TOOL_ASK}], "tools": TOOLS,
        "tool_choice": choice, "parallel_tool_calls": parallel, "max_tokens": max_tokens,
        "temperature": temperature, "seed": seed}, timeout)
    calls = got["message"].get("tool_calls") or []
    wanted = choice["function"]["name"] if isinstance(choice, dict) else None
    valid = got["finish_reason"] == "tool_calls" and bool(calls) and all(
        c["function"]["name"] in params and (wanted is None or c["function"]["name"] == wanted)
        and _valid(c["function"]["arguments"], params[c["function"]["name"]]) for c in calls)
    label = "required" if wanted is None else f"named {wanted}"
    return {"choice": label, "finish": got["finish_reason"], "calls": len(calls),
            "valid": valid, "text": json.dumps(got["message"])}


def run_schemas(url: str, n: int, max_tokens: int = 512, temperature: float = 1.0,
                workers: int = 8, seed: int = 0) -> list[dict]:
    """n requests, the schemas in turn, `workers` at once."""
    names = list(SCHEMAS)
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda i: schema_answer(url, names[i % len(names)], seed + i,
                                                     max_tokens, temperature), range(n)))


def run_tools(url: str, n: int, max_tokens: int = 256, temperature: float = 1.0,
              workers: int = 8, seed: int = 0) -> list[dict]:
    """n requests, required and each named function in turn, parallel calls allowed on every
    other one."""
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda i: tool_answer(
            url, CHOICES[i % len(CHOICES)], seed + i, max_tokens, temperature,
            parallel=i % 2 == 0), range(n)))


def table(rows: list[dict], key: str) -> str:
    """A markdown table: per `key` value and in all, answers, stop, valid among stop."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(r)
    groups["all"] = rows
    lines = [f"| {key} | answers | finish stop or tool_calls | valid (of those) | "
             "finish length | length, yet valid |", "|---|---|---|---|---|---|"]
    for name, rs in groups.items():
        finishes = Counter(r["finish"] for r in rs)
        done = finishes["stop"] + finishes["tool_calls"]
        valid = sum(r["valid"] for r in rs)
        lines.append(f"| {name} | {len(rs)} | {done} ({100 * done / len(rs):.0f}%) | {valid} | "
                     f"{finishes['length']} | {sum(r.get('length_valid', False) for r in rs)} |")
    return "\n".join(lines)
