"""The start with a conversations database that is damaged or cannot be written, or a models
folder that cannot be read: the app starts, the window says what happened and where the user's
file is, that file is kept as it was, and what SQLite can still read is back in the window.
Through the app's own start-up path
(app.__main__.open_window), with the fake worker; one case also as a real `python -m app`."""

from __future__ import annotations

import logging
import os
import shlex
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from app.__main__ import load_request, open_window, parse_args
from app.chat.conversation_list_view import ID_ROLE
from app.history.conversation_store import FILE_NAME, ConversationStore
from app.models.model_picker_dialog import ENTRY_ROLE
from app.paths import REPO_ROOT
from tests.app import damaged_database as dd
from tests.app.conftest import FAKE_COMMAND

WORKER_ARGS = ["--worker-command", shlex.join(FAKE_COMMAND)]
# a conversation row and a message row in different pages: both tables lose a page
MARKERS = [dd.title(7), dd.text(30, 1)[:20]]


@pytest.fixture
def data(tmp_path) -> Path:
    return tmp_path / "data"  # HEARTH_DATA_DIR (tests/app/conftest.py)


@pytest.fixture
def launch(qtbot, settings):
    """launch() -> the window of a start as `python -m app` makes it, loaded by the fake worker."""
    handlers = list(logging.getLogger().handlers)
    windows = []

    def start():
        args = parse_args(WORKER_ARGS)
        window = open_window(args, settings)
        windows.append(window)
        window.show()
        with qtbot.waitSignal(window.worker.sig_loaded, timeout=10_000):
            window.start(load_request(args))
        return window

    yield start
    for window in windows:
        window.worker.kill()
        window.close()
        window.store.close()
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h not in handlers]:  # setup_logging's
        root.removeHandler(handler)
        handler.close()


def shown_conversations(window) -> dict[int, str]:
    items = [window.conversation_list.list.item(i)
             for i in range(window.conversation_list.list.count())]
    return {item.data(ID_ROLE): item.text() for item in items}


def files_of(folder: Path) -> dict[str, bytes]:
    """The user's files in `folder` (hearth.log is Hearth's own, written where it can be)."""
    return {p.name: p.read_bytes() for p in folder.iterdir()
            if p.is_file() and p.name != "hearth.log"}


# ------------------------------------------------------------------ a damaged database

def test_a_damaged_database_is_kept_aside_and_what_is_readable_is_back(launch, data):
    path = data / FILE_NAME
    dd.build(path)
    pages = dd.overwrite_pages_holding(path, MARKERS)
    damaged = path.read_bytes()
    titles, messages = dd.readable(path)
    # the damage is real: rows are lost, and some are left to salvage
    assert 0 < len(titles) < dd.NUM_CONVERSATIONS and dd.title(7) not in titles.values()
    assert 0 < len(messages) < dd.NUM_CONVERSATIONS * dd.NUM_MESSAGES_EACH
    assert len(pages) == 2

    window = launch()

    asides = sorted(data.glob("conversations-damaged-*.sqlite3"))
    assert len(asides) == 1 and asides[0].read_bytes() == damaged  # kept, unchanged
    notice = window.storage_notice
    assert notice.isVisible() and str(asides[0]) in notice.text and "damaged" in notice.text
    assert path.is_file() and window.store.path == path  # a fresh database, saved as usual
    stored = {c.id: c.title for c in window.store.conversations()}
    for cid, title in titles.items():
        assert stored[cid] == title
    for mid, (cid, content) in messages.items():  # every readable message, in its conversation
        assert window.store.message(mid).content == content
        assert window.store.message(mid).conversation_id == cid
    orphans = {cid for cid, _ in messages.values()} - set(titles)
    assert set(stored) == set(titles) | orphans  # lost titles: their messages still shown
    assert all(stored[cid].startswith("Recovered chat") for cid in orphans)
    total = sum(len(window.store.messages(cid)) for cid in stored)
    assert total == len(messages)
    assert shown_conversations(window) == stored
    # it is a working store: new chats are saved in the new file
    new = window.controller.new_conversation()
    with closing(sqlite3.connect(path)) as other:
        assert other.execute("SELECT title FROM conversations WHERE id=?", (new.id,)).fetchone()


def test_a_file_that_is_not_a_database_is_kept_aside(launch, data):
    data.mkdir()
    notes = b"these are my notes, not a database\n" * 500
    (data / FILE_NAME).write_bytes(notes)
    window = launch()
    asides = list(data.glob("conversations-damaged-*.sqlite3"))
    assert len(asides) == 1 and asides[0].read_bytes() == notes
    assert str(asides[0]) in window.storage_notice.text
    assert "could read nothing" in window.storage_notice.text
    assert window.storage_notice.isVisible()
    assert len(window.store.conversations()) == 1  # the new chat of every first start


def test_a_second_damaged_start_keeps_both_old_files(launch, data):
    data.mkdir()
    for n in range(2):
        (data / FILE_NAME).write_bytes(b"junk %d" % n * 1000)
        window = launch()
        window.worker.kill()
        window.store.close()
        window.store = ConversationStore(None)
        (data / FILE_NAME).unlink()
    kept = sorted(p.read_bytes()[:6] for p in data.glob("conversations-damaged-*.sqlite3"))
    assert kept == [b"junk 0", b"junk 1"]


def test_python_m_app_starts_on_a_damaged_database_without_a_traceback(tmp_path):
    data = tmp_path / "d"
    dd.build(data / FILE_NAME)
    dd.overwrite_pages_holding(data / FILE_NAME, MARKERS)
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HEARTH_DATA_DIR": str(data),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    done = subprocess.run([sys.executable, "-m", "app", "--startup-check", *WORKER_ARGS],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "window shown" in done.stdout
    assert len(list(data.glob("conversations-damaged-*.sqlite3"))) == 1
    assert "The conversations database was damaged" in (data / "hearth.log").read_text()


# ------------------------------------------------------------------ places that cannot be written

@pytest.fixture
def read_only():
    """read_only(path): make a file or folder unwritable, even for root (chattr +i); undone
    after the test. Skips where this machine cannot do it."""
    made = []

    def make(path: Path) -> None:
        if os.geteuid() == 0:
            if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
                pytest.skip("root, and chattr +i is not available here")
        else:
            path.chmod(0o555 if path.is_dir() else 0o444)
        made.append(path)
        probe = path / "probe" if path.is_dir() else path
        try:
            with open(probe, "ab"):
                pass
        except OSError:
            return
        pytest.skip(f"{path} stays writable here")

    yield make
    for path in reversed(made):
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        else:
            path.chmod(0o755 if path.is_dir() else 0o644)


def saved_database(data: Path) -> None:
    store = ConversationStore(data / FILE_NAME)
    for i in range(3):
        c = store.create_conversation(f"saved {i}")
        store.add_message(c.id, "user", f"question {i}")
    store.close()


def assert_in_memory_and_working(window) -> None:
    assert window.store.path is None  # nothing is written anywhere
    cid = window.controller.new_conversation().id
    window.store.add_message(cid, "user", "still works")
    assert window.store.messages(cid)[-1].content == "still works"


def test_a_read_only_data_folder(launch, data, read_only):
    saved_database(data)
    before = files_of(data)
    read_only(data)
    window = launch()
    notice = window.storage_notice.text
    assert window.storage_notice.isVisible()
    assert str(data) in notice and "cannot be written" in notice and "memory" in notice
    assert {f"saved {i}" for i in range(3)} <= set(shown_conversations(window).values())
    assert_in_memory_and_working(window)
    assert files_of(data) == before  # nothing the user has is touched


def test_a_read_only_database_file(launch, data, read_only):
    saved_database(data)
    before = files_of(data)
    read_only(data / FILE_NAME)
    window = launch()
    assert window.storage_notice.isVisible() and "memory" in window.storage_notice.text
    assert "the file cannot be written" in window.storage_notice.text
    assert {f"saved {i}" for i in range(3)} <= set(shown_conversations(window).values())
    assert_in_memory_and_working(window)
    assert files_of(data) == before


def test_a_database_path_that_is_a_folder(launch, data):
    (data / FILE_NAME).mkdir(parents=True)
    (data / FILE_NAME / "mine.txt").write_text("keep me")
    window = launch()
    notice = window.storage_notice.text
    assert f"{data / FILE_NAME}: it is a folder, not a database file" in notice
    assert "memory" in notice
    assert_in_memory_and_working(window)
    assert [p.name for p in (data / FILE_NAME).iterdir()] == ["mine.txt"]
    assert (data / FILE_NAME / "mine.txt").read_text() == "keep me"


def test_a_data_folder_that_is_a_file(launch, data):
    data.write_text("a file where the data folder should be")
    window = launch()
    notice = window.storage_notice.text
    assert f"{data} is a file, not a folder" in notice and "memory" in notice
    assert_in_memory_and_working(window)
    assert data.read_text() == "a file where the data folder should be"


def test_a_data_folder_that_cannot_be_created(launch, data, read_only, monkeypatch):
    data.parent.joinpath("locked").mkdir()
    monkeypatch.setenv("HEARTH_DATA_DIR", str(data.parent / "locked" / "data"))
    read_only(data.parent / "locked")
    window = launch()
    assert "cannot be written" in window.storage_notice.text
    assert_in_memory_and_working(window)
    assert list((data.parent / "locked").iterdir()) == []


def test_a_database_path_that_is_a_fifo(launch, data):
    data.mkdir()
    os.mkfifo(data / FILE_NAME)  # opening it to read would wait for a writer forever
    window = launch()
    assert "it is not a regular file" in window.storage_notice.text
    assert_in_memory_and_working(window)


# ------------------------------------------------------------------ a models folder unread

def file_in_its_place(models: Path) -> None:
    models.write_text("a file where the models folder should be")


def under_a_file(models: Path) -> Path:
    models.write_text("a file where a folder above the models folder should be")
    return models / "hearth" / "models"


def name_too_long(models: Path) -> Path:
    return models.parent / ("x" * 300)  # ENAMETOOLONG, which Path.is_file() does not swallow


def symlink_loop(models: Path) -> None:
    (models.parent / "loop").symlink_to(models)
    models.symlink_to(models.parent / "loop")


def permission_denied(models: Path, monkeypatch) -> None:
    """What chmod 000 does for a user (root reads through it): every look inside refused."""
    models.mkdir()
    inside = str(models)

    def refusing(real):
        def call(path, *args, **kwargs):
            if os.fspath(path).startswith(inside):
                raise PermissionError(13, "Permission denied", os.fspath(path))
            return real(path, *args, **kwargs)
        return call

    for name in ("stat", "scandir", "listdir"):
        monkeypatch.setattr(os, name, refusing(getattr(os, name)))


UNREADABLE_MODELS = {"a file in its place": file_in_its_place, "under a file": under_a_file,
                     "a name too long": name_too_long, "a symlink loop": symlink_loop,
                     "permission denied": permission_denied}


@pytest.mark.parametrize("case", list(UNREADABLE_MODELS))
def test_an_unreadable_models_folder_gets_a_notice_and_the_window_works(
        case, launch, tmp_path, monkeypatch, qtbot):
    models = tmp_path / "models"  # HEARTH_MODELS_DIR (tests/app/conftest.py)
    make = UNREADABLE_MODELS[case]
    made = make(models, monkeypatch) if case == "permission denied" else make(models)
    if made is not None:
        monkeypatch.setenv("HEARTH_MODELS_DIR", str(made))
    window = launch()  # the start, loaded by the fake worker: no traceback on the way
    notice = window.storage_notice
    assert notice.isVisible() and "models folder" in notice.text
    assert "cannot be read" in notice.text and "demo model is used" in notice.text
    assert "\n" not in notice.text and "Traceback" not in notice.text
    chat = window.chat_view
    with qtbot.waitSignal(window.controller.sig_generating_changed, timeout=10_000,
                          check_params_cb=lambda on: not on):
        chat.input.setPlainText("Still answering?")
        chat.send_button.click()
    assert window.store.messages(window.controller.conversation.id)[-1].status == "done"
    window.open_model_picker()  # lists what it can: the demo model, not the unreadable folder
    sources = {window.picker.model_list.item(i).data(ENTRY_ROLE).source
               for i in range(window.picker.model_list.count())}
    assert "demo" in sources and "imported" not in sources
    window.picker.reject()


def test_a_missing_models_folder_is_no_problem(launch, tmp_path):
    assert not (tmp_path / "models").exists()  # nothing imported yet: nothing to say
    window = launch()
    assert not window.storage_notice.isVisible()
