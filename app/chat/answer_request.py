"""The request an answer is generated with: the conversation's history (answers without their
thinking), its system prompt, sampling and length, its output schema as the answer's grammar,
and the Think toggle where the loaded model's template can turn the thinking off. No widgets."""

from __future__ import annotations

import json
from pathlib import Path

from app.history.conversation import ChatSettings, Message
from engine.events import (
    BadRequest,
    GenerateRequest,
    GrammarSpec,
    Loaded,
    SamplingParams,
    ThinkingSpec,
)
from engine.events.grammar_spec import MAX_SOURCE_CHARS


def schema_error(text: str) -> str:
    """Why `text` is no output schema, in one sentence; "" where it is one (or empty: none)."""
    if not text.strip():
        return ""
    try:
        json.loads(text)
    except RecursionError:
        return "The output schema is nested too deeply."
    except ValueError as e:
        return f"The output schema is not valid JSON: {e}."
    try:
        GrammarSpec("json_schema", text).validate()
    except BadRequest as e:
        return f"The output schema is refused: {e}."
    return ""


def read_schema(path: str) -> str:
    """A .json file's text as an output schema; BadRequest (one sentence) where it is none: not
    there, not a file, too large, not UTF-8, not a schema."""
    name = Path(path).name or path
    try:
        where = Path(path).expanduser().resolve(strict=True)
        if not where.is_file():
            raise BadRequest(f"{name} is not a file")
        if where.stat().st_size > MAX_SOURCE_CHARS:
            raise BadRequest(f"{name} is larger than {MAX_SOURCE_CHARS:,} bytes")
        text = where.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(f"{name} is not UTF-8 text (byte {e.start})") from None
    except (OSError, RuntimeError) as e:
        raise BadRequest(f"cannot read {name}: {getattr(e, 'strerror', None) or e}") from None
    error = schema_error(text)
    if error:
        raise BadRequest(f"{name}: {error[0].lower()}{error[1:].rstrip('.')}")
    return text


def answer_request(settings: ChatSettings, path: list[Message], loaded: Loaded | None, *,
                   sampling: SamplingParams | None = None, prompt_lookup: bool = False,
                   num_speculative_tokens: int | None = None) -> GenerateRequest:
    """The request answering `path` (the conversation up to the question)."""
    history = tuple({"role": m.role, "content": m.content} for m in path if m.content)
    grammar = GrammarSpec("json_schema", settings.output_schema) \
        if settings.output_schema.strip() else None
    # the thinking always comes apart; the toggle is sent only where the template reads it
    can_stop = loaded is not None and loaded.can_stop_thinking
    return GenerateRequest(
        messages=history, system=settings.system_prompt or None,
        max_new_tokens=settings.max_new_tokens, sampling=sampling or settings.sampling(),
        prompt_lookup=prompt_lookup, stop_on_repetition=True,
        num_speculative_tokens=num_speculative_tokens if prompt_lookup else None,
        grammar=grammar, thinking=ThinkingSpec(settings.think if can_stop else None))
