"""Builders for the conversations-database tests: a real 50-conversation file, the same file with
pages overwritten by junk, and what SQLite can still read of it (the oracle a salvage is held to),
read one id at a time, independently of the app's own row-by-row salvage."""

from __future__ import annotations

import random
import shutil
import sqlite3
import tempfile
from contextlib import closing
from pathlib import Path

from app.history.conversation_store import ConversationStore

NUM_CONVERSATIONS = 50
NUM_MESSAGES_EACH = 4


def title(i: int) -> str:
    return f"Chat {i:02d} about topic {i * 7 % 13}"


def text(i: int, j: int) -> str:
    return f"Message {i:02d}.{j} " + "the quick brown fox jumps over the lazy dog " * 12


def build(path: Path) -> None:
    """50 conversations of 4 messages each, written by the real store (WAL, then checkpointed
    into the file by the last close)."""
    store = ConversationStore(path)
    for i in range(NUM_CONVERSATIONS):
        c = store.create_conversation(title(i))
        for j in range(NUM_MESSAGES_EACH):
            store.add_message(c.id, ("user", "assistant")[j % 2], text(i, j))
    store.close()
    assert not Path(f"{path}-wal").exists()  # everything is in the one file


def overwrite_pages_holding(path: Path, markers: list[str], seed: int = 22) -> list[int]:
    """Overwrite with random junk each page (page_size from the file) that holds a marker;
    the 1-based page numbers."""
    with closing(sqlite3.connect(path)) as db:
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
    data = bytearray(path.read_bytes())
    rng = random.Random(seed)
    pages = []
    for marker in markers:
        offset = data.find(marker.encode())
        assert offset >= 0, marker
        page = offset // page_size
        data[page * page_size:(page + 1) * page_size] = rng.randbytes(page_size)
        pages.append(page + 1)
    path.write_bytes(bytes(data))
    return pages


def readable(path: Path) -> tuple[dict[int, str], dict[int, tuple[int, str]]]:
    """({conversation id: title}, {message id: (conversation id, content)}) that SQLite can
    still read, each row asked for on its own, from a copy (the file itself is left alone)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "copy.sqlite3"
        shutil.copyfile(path, copy)
        with closing(sqlite3.connect(copy)) as db:
            conversations = _rows(db, "SELECT title FROM conversations WHERE id=?",
                                  range(1, NUM_CONVERSATIONS + 1))
            messages = _rows(db, "SELECT conversation_id, content FROM messages WHERE id=?",
                             range(1, NUM_CONVERSATIONS * NUM_MESSAGES_EACH + 1))
    return ({k: v[0] for k, v in conversations.items()},
            {k: (v[0], v[1]) for k, v in messages.items()})


def _rows(db: sqlite3.Connection, query: str, ids) -> dict[int, tuple]:
    found = {}
    for i in ids:
        try:
            row = db.execute(query, (i,)).fetchone()
        except sqlite3.DatabaseError:
            continue
        if row is not None:
            found[i] = row
    return found
