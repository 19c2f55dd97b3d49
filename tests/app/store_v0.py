"""The conversations store as version 0 wrote databases (app/conversation_store.py at 797777b,
before alternatives and search), kept verbatim below this docstring so that tests can build an
old database without git. Not used by the app."""

# ruff: noqa

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path

from app.history.conversation import DEFAULT_TITLE, ChatSettings, Conversation, Message
from engine.events import Stats

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: ids order messages
    title TEXT NOT NULL,
    settings_json TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: ids order messages
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    status TEXT NOT NULL,
    finish_reason TEXT,
    error TEXT,
    stats_json TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""
FILE_NAME = "conversations.sqlite3"
# the columns restore() takes, in this order (store_salvage.py reads them from a damaged file)
CONVERSATION_COLUMNS = ("id", "title", "settings_json", "created_at", "updated_at")
MESSAGE_COLUMNS = ("id", "conversation_id", "role", "content", "status", "finish_reason", "error",
                   "stats_json", "created_at")


class ConversationStore:
    """Opening the store marks answers left `streaming` by a previous run as `interrupted`.

    `path` None keeps everything in memory (store_opening.py: when nothing can be written).
    """

    def __init__(self, path: Path | None) -> None:
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # autocommit: every statement is durable on its own, no transaction left open
        self._db = sqlite3.connect(self.path or ":memory:", isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL survives a process kill
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)
        cur = self._db.execute("UPDATE messages SET status='interrupted' WHERE status='streaming'")
        self.num_interrupted = cur.rowcount

    def close(self) -> None:
        self._db.close()

    @property
    def journal_mode(self) -> str:
        return self._db.execute("PRAGMA journal_mode").fetchone()[0]

    # ------------------------------------------------------------------ conversations

    def conversations(self) -> list[Conversation]:
        rows = self._db.execute(
            "SELECT id, title, settings_json, updated_at FROM conversations "
            "ORDER BY updated_at DESC, id DESC")
        return [Conversation(r[0], r[1], ChatSettings.from_json(r[2]), r[3]) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation | None:
        r = self._db.execute("SELECT id, title, settings_json, updated_at FROM conversations "
                             "WHERE id=?", (conversation_id,)).fetchone()
        return Conversation(r[0], r[1], ChatSettings.from_json(r[2]), r[3]) if r else None

    def create_conversation(self, title: str = DEFAULT_TITLE,
                            settings: ChatSettings | None = None) -> Conversation:
        settings = settings or ChatSettings()
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO conversations (title, settings_json, created_at, updated_at) "
            "VALUES (?, ?, ?, ?)", (title, settings.to_json(), now, now))
        return Conversation(cur.lastrowid, title, settings, now)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self._db.execute("UPDATE conversations SET title=? WHERE id=?", (title, conversation_id))

    def update_settings(self, conversation_id: int, settings: ChatSettings) -> None:
        self._db.execute("UPDATE conversations SET settings_json=? WHERE id=?",
                         (settings.to_json(), conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    # ------------------------------------------------------------------ messages

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._db.execute(
            "SELECT id, conversation_id, role, content, status, finish_reason, error, stats_json "
            "FROM messages WHERE conversation_id=? ORDER BY id", (conversation_id,))
        return [_message(r) for r in rows]

    def message(self, message_id: int) -> Message | None:
        r = self._db.execute(
            "SELECT id, conversation_id, role, content, status, finish_reason, error, stats_json "
            "FROM messages WHERE id=?", (message_id,)).fetchone()
        return _message(r) if r else None

    def add_message(self, conversation_id: int, role: str, content: str,
                    status: str = "done") -> Message:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO messages (conversation_id, role, content, status, created_at) "
            "VALUES (?, ?, ?, ?, ?)", (conversation_id, role, content, status, now))
        self._touch(conversation_id, now)
        return Message(cur.lastrowid, conversation_id, role, content, status)

    def set_content(self, message_id: int, content: str) -> None:
        self._db.execute("UPDATE messages SET content=? WHERE id=?", (content, message_id))

    def finish_message(self, message_id: int, content: str, status: str,
                       finish_reason: str | None = None, error: str | None = None,
                       stats: Stats | None = None) -> Message:
        stats_json = json.dumps(dataclasses.asdict(stats)) if stats is not None else None
        self._db.execute(
            "UPDATE messages SET content=?, status=?, finish_reason=?, error=?, stats_json=? "
            "WHERE id=?", (content, status, finish_reason, error, stats_json, message_id))
        return self.message(message_id)

    def delete_messages_after(self, conversation_id: int, message_id: int) -> None:
        """Delete the messages that follow `message_id` (edit-and-resend, regenerate)."""
        self._db.execute("DELETE FROM messages WHERE conversation_id=? AND id>?",
                         (conversation_id, message_id))

    def restore(self, conversations: list[tuple], messages: list[tuple]) -> None:
        """Insert rows read from another database (CONVERSATION_COLUMNS, MESSAGE_COLUMNS),
        keeping their ids, in one transaction: ids order messages."""
        cols_c, cols_m = ", ".join(CONVERSATION_COLUMNS), ", ".join(MESSAGE_COLUMNS)
        with self._transaction():
            self._db.executemany(
                f"INSERT INTO conversations ({cols_c}) VALUES ({', '.join('?' * 5)})",
                conversations)
            self._db.executemany(
                f"INSERT INTO messages ({cols_m}) VALUES ({', '.join('?' * 9)})", messages)

    @contextmanager
    def _transaction(self):
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _touch(self, conversation_id: int, now: float) -> None:
        self._db.execute("UPDATE conversations SET updated_at=? WHERE id=?",
                         (now, conversation_id))


def _message(r) -> Message:
    stats = None
    if r[7]:
        known = {f.name for f in dataclasses.fields(Stats)}  # rows may predate a Stats field
        stats = Stats(**{k: v for k, v in json.loads(r[7]).items() if k in known})
    return Message(r[0], r[1], r[2], r[3], r[4], r[5], r[6], stats)
