"""Reading what SQLite can still read from a damaged conversations database, row by row, into a
fresh store. Only ever reads a copy: the damaged file is the user's and stays as it was."""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from app.history.conversation import ROLES, STATUSES, ChatSettings
from app.history.conversation_store import CONVERSATION_COLUMNS, MESSAGE_COLUMNS, ConversationStore

# consecutive rowids that cannot be read before a table is given up as read to its end
MAX_UNREADABLE_IDS = 100_000
MAX_BATCH = 512  # rows read at once while nothing fails
RECOVERED_TITLE = "Recovered chat {id}"  # for messages whose conversation row is lost


@dataclass(frozen=True)
class Salvage:
    num_conversations: int
    num_messages: int


def salvage(path: Path, store: ConversationStore) -> Salvage:
    """Copy every readable conversation and message of the database at `path` into `store`.

    A file that cannot be read at all salvages nothing; this never raises for a damaged file.
    """
    with tempfile.TemporaryDirectory(prefix="hearth-salvage-") as tmp:
        try:
            db = _open_copy(path, Path(tmp))
        except (OSError, sqlite3.Error):
            return Salvage(0, 0)
        with closing(db):
            conversations = [c for r in readable_rows(db, "conversations", CONVERSATION_COLUMNS)
                             if (c := _conversation(r)) is not None]
            messages = [m for r in readable_rows(db, "messages", MESSAGE_COLUMNS)
                        if (m := _message(r)) is not None]
    known = {c[0] for c in conversations}
    orphans: dict[int, list[tuple]] = {}
    for m in messages:
        if m[1] not in known:
            orphans.setdefault(m[1], []).append(m)
    for cid, group in orphans.items():  # their messages are the user's: keep them, under a title
        times = [m[8] for m in group]
        conversations.append((cid, RECOVERED_TITLE.format(id=cid), ChatSettings().to_json(),
                              min(times), max(times)))
    store.restore(conversations, messages)
    return Salvage(len(known), len(messages))


def readable_rows(db: sqlite3.Connection, table: str, columns: tuple[str, ...]) -> list[tuple]:
    """The rows of `table` in id order, stepping past ids that sit on pages SQLite cannot read.

    Rows come in batches under a LIMIT, so a read never steps onto a damaged page past its last
    row (sqlite3 fetches a row ahead: a plain scan loses the row before the damage). A failing
    batch is halved down to one row; a failing single row is skipped. A seek to `id >= n`, not
    `id > n - 1`: the latter starts at n - 1, which may sit on the damaged page, and misses n.
    """
    if table not in _tables(db):  # none when the file is no database at all: nothing to seek
        return []
    select = f"SELECT {', '.join(columns)} FROM {table} WHERE id >= ? ORDER BY id LIMIT ?"
    last_id = _last_id(db, table)
    rows: list[tuple] = []
    next_id, batch_size, num_unreadable = 0, MAX_BATCH, 0
    while num_unreadable <= MAX_UNREADABLE_IDS and (last_id is None or next_id <= last_id):
        try:
            batch = db.execute(select, (next_id, batch_size)).fetchall()
        except sqlite3.DatabaseError:
            if batch_size > 1:
                batch_size //= 2
            else:
                next_id += 1
                num_unreadable += 1
            continue
        if not batch:
            break
        rows.extend(batch)
        next_id, num_unreadable = batch[-1][0] + 1, 0
        batch_size = min(batch_size * 2, MAX_BATCH)
    return rows


def _tables(db: sqlite3.Connection) -> set[str]:
    try:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError:
        return set()


def _last_id(db: sqlite3.Connection, table: str) -> int | None:
    """The highest id the table has held (AUTOINCREMENT keeps it), or None if unreadable."""
    for query in ("SELECT seq FROM sqlite_sequence WHERE name=?", f"SELECT max(id) FROM {table}"):
        try:
            row = db.execute(query, (table,) if "?" in query else ()).fetchone()
        except sqlite3.DatabaseError:
            continue
        if row is not None and isinstance(row[0], int):
            return row[0]
    return None


def _open_copy(path: Path, folder: Path) -> sqlite3.Connection:
    """A connection to a copy of the database and its WAL (the WAL holds the latest commits)."""
    copy = folder / "salvage.sqlite3"
    shutil.copyfile(path, copy)
    wal = Path(f"{path}-wal")
    if wal.is_file():
        shutil.copyfile(wal, Path(f"{copy}-wal"))
    return sqlite3.connect(copy, isolation_level=None)


def _is_time(value) -> bool:
    return isinstance(value, (int, float))


def _conversation(r: tuple) -> tuple | None:
    """A conversation row fit to insert, or None; damage may leave any value in any column."""
    cid, title, settings_json, created_at, updated_at = r
    if not isinstance(cid, int) or not _is_time(created_at) or not _is_time(updated_at):
        return None
    try:
        settings_json = ChatSettings.from_json(settings_json).to_json()
    except (TypeError, ValueError, AttributeError):
        settings_json = ChatSettings().to_json()  # the chat matters more than its settings
    title = title if isinstance(title, str) else RECOVERED_TITLE.format(id=cid)
    return cid, title, settings_json, created_at, updated_at


def _message(r: tuple) -> tuple | None:
    mid, cid, role, content, status, finish_reason, error, stats_json, created_at = r
    if not (isinstance(mid, int) and isinstance(cid, int) and role in ROLES
            and isinstance(content, str) and _is_time(created_at)):
        return None
    if status not in STATUSES or status == "streaming":
        status = "interrupted"  # cut off when the file broke, as after a kill
    finish_reason = finish_reason if isinstance(finish_reason, str) else None
    error = error if isinstance(error, str) else None
    if stats_json is not None and not _is_json_object(stats_json):
        stats_json = None
    return mid, cid, role, content, status, finish_reason, error, stats_json, created_at


def _is_json_object(text) -> bool:
    try:
        return isinstance(text, str) and isinstance(json.loads(text), dict)
    except ValueError:
        return False
