"""Conversations and messages in SQLite (WAL), written as they stream so that a kill loses
nothing committed; answer alternatives as a tree of messages; full-text search (FTS5). The
stdlib sqlite3 on the GUI thread: each write is a small, quick commit. Schema: store_schema.py."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from app.history import store_schema
from app.history.conversation import DEFAULT_TITLE, ChatSettings, Conversation, Message
from engine.events import Stats

FILE_NAME = "conversations.sqlite3"
# the columns restore() takes, in this order (store_salvage.py reads them from a damaged file)
CONVERSATION_COLUMNS = ("id", "title", "settings_json", "created_at", "updated_at")
MESSAGE_COLUMNS = ("id", "conversation_id", "role", "content", "status", "finish_reason", "error",
                   "stats_json", "created_at")
SELECT_MESSAGE = ("SELECT id, conversation_id, role, content, status, finish_reason, error, "
                  "stats_json, parent_id, is_shown, reasoning, thinking_s, is_json FROM messages")
END_OF_PATH = object()  # add_message's default parent: the last message shown
MAX_SEARCH_HITS = 50


@dataclass(frozen=True)
class SearchHit:
    conversation: Conversation
    snippet: str  # the matching words in context, plain text


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
        store_schema.migrate(self._db)
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
        """The conversation as shown: from its first message, each time the alternative shown."""
        rows = self._db.execute(f"{SELECT_MESSAGE} WHERE conversation_id=? ORDER BY id",
                                (conversation_id,)).fetchall()
        children: dict[int | None, list] = {}
        for r in rows:
            children.setdefault(r[8], []).append(r)
        path, parent = [], None
        while children.get(parent):
            siblings = children[parent]
            shown = next((r for r in siblings if r[9]), siblings[-1])
            path.append(_message(shown, siblings.index(shown) + 1, len(siblings)))
            parent = shown[0]
            if len(path) > len(rows):  # a cycle no version writes: stop rather than hang
                break
        return path

    def message(self, message_id: int) -> Message | None:
        r = self._db.execute(f"{SELECT_MESSAGE} WHERE id=?", (message_id,)).fetchone()
        if r is None:
            return None
        siblings = self._sibling_ids(r[1], r[8])
        return _message(r, siblings.index(r[0]) + 1, len(siblings))

    def alternatives(self, message_id: int) -> list[int]:
        """The ids of a message and its siblings (the answers to one question), oldest first."""
        r = self._db.execute("SELECT conversation_id, parent_id FROM messages WHERE id=?",
                             (message_id,)).fetchone()
        return self._sibling_ids(*r) if r else []

    def show_alternative(self, message_id: int) -> None:
        """Show this message instead of its siblings; what follows it is its own branch."""
        r = self._db.execute("SELECT conversation_id, parent_id FROM messages WHERE id=?",
                             (message_id,)).fetchone()
        if r is not None:
            self._db.execute("UPDATE messages SET is_shown=(id=?) WHERE conversation_id=? "
                             "AND parent_id IS ?", (message_id, *r))

    def add_message(self, conversation_id: int, role: str, content: str,
                    status: str = "done", parent_id=END_OF_PATH, is_json: bool = False) -> Message:
        """Append after `parent_id` (by default the last message shown); a message added
        beside others of the same parent is an alternative, and the one shown. `is_json`: an
        answer under an output schema."""
        if parent_id is END_OF_PATH:
            path = self.messages(conversation_id)
            parent_id = path[-1].id if path else None
        now = time.time()
        with self._transaction():
            self._db.execute("UPDATE messages SET is_shown=0 WHERE conversation_id=? "
                             "AND parent_id IS ?", (conversation_id, parent_id))
            cur = self._db.execute(
                "INSERT INTO messages (conversation_id, role, content, status, created_at, "
                "parent_id, is_shown, is_json) VALUES (?, ?, ?, ?, ?, ?, 1, ?)",
                (conversation_id, role, content, status, now, parent_id, int(is_json)))
            self._touch(conversation_id, now)
        return self.message(cur.lastrowid)

    def set_content(self, message_id: int, content: str, reasoning: str = "",
                    thinking_s: float | None = None) -> None:
        self._db.execute("UPDATE messages SET content=?, reasoning=?, thinking_s=? WHERE id=?",
                         (content, reasoning, thinking_s, message_id))

    def finish_message(self, message_id: int, content: str, status: str,
                       finish_reason: str | None = None, error: str | None = None,
                       stats: Stats | None = None, reasoning: str = "",
                       thinking_s: float | None = None) -> Message:
        stats_json = json.dumps(dataclasses.asdict(stats)) if stats is not None else None
        self._db.execute(
            "UPDATE messages SET content=?, status=?, finish_reason=?, error=?, stats_json=?, "
            "reasoning=?, thinking_s=? WHERE id=?",
            (content, status, finish_reason, error, stats_json, reasoning, thinking_s,
             message_id))
        return self.message(message_id)

    def delete_messages_after(self, conversation_id: int, message_id: int) -> None:
        """Delete what follows `message_id`: every branch after it (edit-and-resend)."""
        self._db.execute(
            "WITH RECURSIVE after(id) AS (SELECT id FROM messages WHERE parent_id=? "
            "AND conversation_id=? UNION ALL SELECT m.id FROM messages m JOIN after "
            "ON m.parent_id=after.id) DELETE FROM messages WHERE id IN after",
            (message_id, conversation_id))

    def search(self, text: str) -> list[SearchHit]:
        """Conversations whose messages or title hold every word of `text` (a word's start
        matches: "quant" finds "quantized"), most recent first."""
        words = text.split()
        if not words:
            return []
        # each word quoted: the user's text is never FTS5 syntax (AND, NEAR, "*", "-")
        query = " ".join('"' + w.replace('"', '""') + '"*' for w in words)
        rows = self._db.execute(
            "SELECT m.conversation_id, snippet(messages_fts, 0, '', '', '…', 12) "
            "FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid "
            "WHERE messages_fts MATCH ? ORDER BY m.id DESC", (query,)).fetchall()
        snippets: dict[int, str] = {}
        for cid, snippet in rows:
            snippets.setdefault(cid, " ".join(snippet.split()))
        hits = []
        for conversation in self.conversations():
            title = conversation.title.lower()
            if conversation.id in snippets or all(w.lower() in title for w in words):
                hits.append(SearchHit(conversation, snippets.get(conversation.id, "")))
        return hits[:MAX_SEARCH_HITS]

    def import_conversation(self, title: str, settings: ChatSettings,
                            messages: tuple[tuple[str, str], ...]) -> Conversation:
        """A whole conversation in one transaction: all of it is kept, or none."""
        now = time.time()
        with self._transaction():
            cur = self._db.execute(
                "INSERT INTO conversations (title, settings_json, created_at, updated_at) "
                "VALUES (?, ?, ?, ?)", (title, settings.to_json(), now, now))
            cid, parent = cur.lastrowid, None
            for role, content in messages:
                parent = self._db.execute(
                    "INSERT INTO messages (conversation_id, role, content, status, created_at, "
                    "parent_id, is_shown) VALUES (?, ?, ?, 'done', ?, ?, 1)",
                    (cid, role, content, now, parent)).lastrowid
        return self.conversation(cid)

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
            # the rows carry no tree: each follows the one before in its conversation
            store_schema.link_in_order(self._db, [m[0] for m in messages])

    @contextmanager
    def _transaction(self):
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _sibling_ids(self, conversation_id: int, parent_id: int | None) -> list[int]:
        return [r[0] for r in self._db.execute(
            "SELECT id FROM messages WHERE conversation_id=? AND parent_id IS ? ORDER BY id",
            (conversation_id, parent_id))]

    def _touch(self, conversation_id: int, now: float) -> None:
        self._db.execute("UPDATE conversations SET updated_at=? WHERE id=?",
                         (now, conversation_id))


def _message(r, alternative: int = 1, num_alternatives: int = 1) -> Message:
    stats = None
    if r[7]:
        known = {f.name for f in dataclasses.fields(Stats)}  # rows may predate a Stats field
        stats = Stats(**{k: v for k, v in json.loads(r[7]).items() if k in known})
    return Message(r[0], r[1], r[2], r[3], r[4], r[5], r[6], stats, r[8], alternative,
                   num_alternatives, r[10], r[11], bool(r[12]))
