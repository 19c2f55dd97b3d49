"""A conversation out as Markdown or as JSON in OpenAI's message format, and such a JSON file
read back in: every check is made before anything is written, so a malformed or hostile file is
refused in one sentence and nothing of it is kept. Plain functions, no Qt, no database."""

from __future__ import annotations

import json
from dataclasses import dataclass

from app.history.conversation import Conversation, Message

MAX_IMPORT_BYTES = 32 << 20
MAX_MESSAGES = 10_000
MAX_TITLE_CHARS = 200
ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}


class ImportRefused(ValueError):
    """A file that is not a conversation Hearth can take: one sentence for the user."""


@dataclass(frozen=True)
class ImportedConversation:
    title: str
    system_prompt: str
    messages: tuple[tuple[str, str], ...]  # (role, content), user and assistant only


def to_markdown(conversation: Conversation, messages: list[Message]) -> str:
    parts = [f"# {conversation.title}"]
    if conversation.settings.system_prompt:
        parts.append(f"**System**\n\n{conversation.settings.system_prompt}")
    for m in messages:
        parts.append(f"**{ROLE_NAMES.get(m.role, m.role)}**\n\n{m.content}")
    return "\n\n".join(parts) + "\n"


def to_json(conversation: Conversation, messages: list[Message]) -> str:
    """{"title", "messages": [{"role", "content"}]}: what OpenAI's chat API takes, reasoning
    left out of answers as it is left out of what the model sees again."""
    out = []
    if conversation.settings.system_prompt:
        out.append({"role": "system", "content": conversation.settings.system_prompt})
    for m in messages:  # an answer's thinking is its own, not the conversation's
        out.append({"role": m.role, "content": m.content})
    return json.dumps({"title": conversation.title, "messages": out}, ensure_ascii=False,
                      indent=2) + "\n"


def parse_json(data: bytes, name: str = "the file") -> ImportedConversation:
    """Raises ImportRefused (one sentence naming `name`) unless all of it can be imported."""
    if len(data) > MAX_IMPORT_BYTES:
        raise ImportRefused(f"{name} is larger than {MAX_IMPORT_BYTES >> 20} MB, which no "
                            "exported conversation is")
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ImportRefused(f"{name} is not UTF-8 text, so it is no exported conversation") \
            from None
    except RecursionError:
        raise ImportRefused(f"{name} is nested too deeply to be a conversation") from None
    except ValueError as e:
        raise ImportRefused(f"{name} is not valid JSON ({str(e).split(':')[0]})") from None
    if isinstance(obj, list):  # a bare list of messages, as the API's request holds it
        obj = {"messages": obj}
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
        raise ImportRefused(f"{name} holds no \"messages\" list, so it is not a conversation in "
                            "OpenAI's message format")
    raw = obj["messages"]
    if not raw:
        raise ImportRefused(f"{name} holds no messages")
    if len(raw) > MAX_MESSAGES:
        raise ImportRefused(f"{name} holds {len(raw):,} messages; at most {MAX_MESSAGES:,} are "
                            "taken")
    system, messages = [], []
    for i, m in enumerate(raw):
        role, content = _checked_message(m, i, name)
        if role == "system":
            if messages:
                raise ImportRefused(f"message {i + 1} of {name} is a system message after the "
                                    "conversation began; Hearth keeps one system prompt first")
            system.append(content)
        else:
            messages.append((role, content))
    if not messages:
        raise ImportRefused(f"{name} holds only a system prompt, no messages")
    title = obj.get("title")
    if title is not None and not isinstance(title, str):
        raise ImportRefused(f"the title in {name} is not text")
    title = " ".join(_text(title or "", "the title", name).split())[:MAX_TITLE_CHARS]
    return ImportedConversation(title or "Imported chat", "\n\n".join(system), tuple(messages))


def _checked_message(m, i: int, name: str) -> tuple[str, str]:
    where = f"message {i + 1} of {name}"
    if not isinstance(m, dict):
        raise ImportRefused(f"{where} is not an object with a role and a content")
    role = m.get("role")
    if role not in ("system", "user", "assistant"):
        raise ImportRefused(f"{where} has the role {str(role)[:30]!r}; Hearth takes system, "
                            "user and assistant messages")
    content = m.get("content")
    if isinstance(content, list):  # OpenAI's content parts: the text ones, in order
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise ImportRefused(f"{where} holds content parts other than text (images, audio), "
                                "which Hearth cannot show")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise ImportRefused(f"{where} has no text content")
    return role, _text(content, where, name)


def _text(text: str, where: str, _name: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a JSON escape can carry a lone surrogate, which is no text
        raise ImportRefused(f"{where} holds a lone surrogate (\\ud800-\\udfff), which is not "
                            "text") from None
    if "\0" in text:
        raise ImportRefused(f"{where} holds a NUL character, which is not text")
    return text
