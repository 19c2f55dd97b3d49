"""Opening the conversations database at start, whatever is on disk: a damaged file is moved aside
(never deleted) and salvaged into a fresh one; an unwritable place gives an in-memory store.
Either way the window gets one notice saying what happened and where the user's file is."""

from __future__ import annotations

import sqlite3
import tempfile
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from app.history.conversation_store import FILE_NAME, ConversationStore
from app.history.store_salvage import Salvage, salvage

# SQLite's primary result codes for a file that is damaged or is not a database at all
SQLITE_CORRUPT, SQLITE_NOTADB = 11, 26
SIDE_FILES = ("-wal", "-shm")  # they belong to the database file and move with it


@dataclass(frozen=True)
class OpenedStore:
    store: ConversationStore
    notice: str = ""  # what the window must tell the user; "" when all is as usual


def open_store(folder: Path) -> OpenedStore:
    """The store in `folder`/conversations.sqlite3, or the best that can be done instead."""
    path = folder / FILE_NAME
    problem = _unwritable(folder, path)
    if problem:
        return _in_memory(path, problem)
    if path.exists():
        try:
            damage = _damage(path)
        except (OSError, sqlite3.Error) as e:
            return _in_memory(path, _reason(e))
        if damage:
            return _replace_damaged(path)
    try:
        return OpenedStore(ConversationStore(path))
    except (OSError, sqlite3.Error) as e:  # a read-only file, a full disk, a locked database
        return _in_memory(path, _reason(e))


def aside_path(path: Path, now: float | None = None) -> Path:
    """conversations-damaged-20261201-153012.sqlite3 beside `path`, a name not yet taken."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    for n in range(1, 1000):
        suffix = "" if n == 1 else f"-{n}"
        candidate = path.with_name(f"{path.stem}-damaged-{stamp}{suffix}{path.suffix}")
        if not any(Path(f"{candidate}{s}").exists() for s in ("", *SIDE_FILES)):
            return candidate
    raise FileExistsError(f"no free name for a copy of {path} in {path.parent}")


def _unwritable(folder: Path, path: Path) -> str:
    """Why nothing can be saved in `folder`, or "". Tried, not guessed from permission bits:
    root ignores them, and read-only mounts and immutable folders have none to read."""
    if folder.exists() and not folder.is_dir():
        return f"{folder} is a file, not a folder"
    if path.is_dir():
        return "it is a folder, not a database file"
    if path.exists() and not path.is_file():  # a FIFO would block the start on its open
        return "it is not a regular file"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return f"the folder {folder} cannot be written ({e.strerror or e})"
    try:
        if path.is_file():
            with open(path, "r+b"):  # opened for writing, nothing written
                pass
    except OSError as e:  # else SQLite would open it read-only and leave -wal, -shm beside it
        return f"the file cannot be written ({e.strerror or e})"
    return ""


def _damage(path: Path) -> str:
    """SQLite's complaint about the file at `path` ("" when intact), read without writing."""
    uri = f"{path.resolve().as_uri()}?mode=ro"
    try:
        with closing(sqlite3.connect(uri, uri=True)) as db:
            result = db.execute("PRAGMA quick_check(1)").fetchone()[0]
    except sqlite3.DatabaseError as e:
        if (getattr(e, "sqlite_errorcode", 0) & 0xFF) in (SQLITE_CORRUPT, SQLITE_NOTADB):
            return str(e)
        raise
    return "" if result == "ok" else result


def _replace_damaged(path: Path) -> OpenedStore:
    aside = aside_path(path)
    try:
        for s in ("", *SIDE_FILES):
            if Path(f"{path}{s}").exists():
                Path(f"{path}{s}").rename(Path(f"{aside}{s}"))
    except OSError as e:
        return _in_memory(path, f"it is damaged and could not be moved aside ({_reason(e)})")
    kept = f"The conversations database was damaged: Hearth kept it, unchanged, as {aside}"
    try:
        store = ConversationStore(path)
    except (OSError, sqlite3.Error) as e:
        store = ConversationStore(None)
        return OpenedStore(store, f"{kept}, but could not start a new one ({_reason(e)}); "
                                  f"chats are kept in memory only until Hearth closes"
                                  f"{_recovered(salvage(aside, store))}.")
    return OpenedStore(store, f"{kept}, started a new one{_recovered(salvage(aside, store))}.")


def _recovered(found: Salvage) -> str:
    if not (found.num_conversations or found.num_messages):
        return ", and could read nothing from the damaged file"
    return (f", and recovered {found.num_conversations} conversation(s) and "
            f"{found.num_messages} message(s) that could still be read")


def _in_memory(path: Path, reason: str) -> OpenedStore:
    """A store in memory, holding what can be read of the file at `path` (only read)."""
    store = ConversationStore(None)
    found = salvage(path, store) if path.is_file() else None
    shown = (f" The {found.num_conversations} saved conversation(s) that could be read are "
             "shown." if found and found.num_conversations else "")
    return OpenedStore(store, f"Hearth cannot save conversations to {path}: {reason}. Chats are "
                              "kept in memory only until Hearth closes, and nothing there was "
                              f"changed.{shown}")


def _reason(e: Exception) -> str:
    return str(e.strerror or e) if isinstance(e, OSError) else str(e)
