"""The conversations database's schema and its migrations: tables as the first version wrote
them, then (user_version 1) message parents and shown alternatives, and a full-text index, then
(2) an answer's thinking apart from its content, the seconds it thought, and whether it answered
under an output schema (JSON)."""

from __future__ import annotations

import sqlite3

from engine.answer.reader import Reading, read_whole
from engine.answer.reasoning import CLOSE, OPEN

BASE_SCHEMA = """
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
# external content: the index holds terms only, the text stays in messages (no second copy)
SEARCH_SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    content, content='messages', content_rowid='id');
CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER IF NOT EXISTS messages_fts_update AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
"""
VERSION = 2


def migrate(db: sqlite3.Connection) -> None:
    """Bring a database of any earlier version (or a new, empty one) to VERSION in one
    transaction: a failure leaves the file as it was."""
    db.executescript(BASE_SCHEMA)
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version >= VERSION:
        return
    db.execute("BEGIN")
    try:
        columns = {r[1] for r in db.execute("PRAGMA table_info(messages)")}
        if version < 1:
            if "parent_id" not in columns:
                db.execute("ALTER TABLE messages ADD COLUMN parent_id INTEGER")
                db.execute("ALTER TABLE messages ADD COLUMN is_shown INTEGER NOT NULL "
                           "DEFAULT 1")
                link_in_order(db)
            db.execute("CREATE INDEX IF NOT EXISTS messages_by_parent ON messages(parent_id)")
            for statement in _statements(SEARCH_SCHEMA):
                db.execute(statement)
            db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")
        if "reasoning" not in columns:
            db.execute("ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT ''")
            db.execute("ALTER TABLE messages ADD COLUMN thinking_s REAL")
            db.execute("ALTER TABLE messages ADD COLUMN is_json INTEGER NOT NULL DEFAULT 0")
            split_thinking(db)
        db.execute(f"PRAGMA user_version={VERSION}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def link_in_order(db: sqlite3.Connection, ids: list[int] | None = None) -> None:
    """Each message (of `ids`, else all) follows the one before it in its conversation: the
    first version kept a conversation as one line of messages in id order."""
    where = f"WHERE id IN ({','.join('?' * len(ids))})" if ids else ""
    rows = db.execute(f"SELECT id, conversation_id FROM messages {where} ORDER BY id",
                      ids or ()).fetchall()
    last: dict[int, int] = {}
    links = []
    for mid, cid in rows:
        links.append((last.get(cid), mid))
        last[cid] = mid
    db.executemany("UPDATE messages SET parent_id=?, is_shown=1 WHERE id=?", links)


def split_thinking(db: sqlite3.Connection) -> None:
    """Answers of earlier versions kept the thinking in their text, in think tags: read apart
    as the engine reads a streamed answer now (a reply that starts inside the thinking, where
    the template opened it, holds only its close tag)."""
    rows = db.execute("SELECT id, content FROM messages WHERE role='assistant' AND "
                      "(instr(content, ?) > 0 OR instr(content, ?) > 0)",
                      (OPEN, CLOSE)).fetchall()
    for mid, text in rows:
        opened = CLOSE in text and not 0 <= text.find(OPEN) < text.find(CLOSE)
        message, _ = read_whole(Reading(thinks=True, thinking_open=opened), text)
        db.execute("UPDATE messages SET content=?, reasoning=? WHERE id=?",
                   (message.content, message.reasoning, mid))


def _statements(script: str) -> list[str]:
    """A script's statements, triggers whole (their bodies hold `;` too)."""
    out, current = [], ""
    for line in script.strip().splitlines():
        current += line + "\n"
        if sqlite3.complete_statement(current):
            out.append(current.strip())
            current = ""
    return out
