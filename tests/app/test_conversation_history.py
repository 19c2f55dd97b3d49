"""The conversations database over time: a file written by the previous version (the store at
git HEAD before alternatives) opens and migrates with nothing lost; alternatives and the one
shown survive a restart; full-text search; export and re-import; hostile imports refused whole."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing

import pytest

from app.chat import conversation_export
from app.chat.conversation_export import ImportRefused
from app.history import store_schema
from app.history.conversation import ChatSettings
from app.history.conversation_store import FILE_NAME, ConversationStore


@pytest.fixture(scope="module")
def old_store_module():
    """app/history/conversation_store.py as the previous version wrote databases (verbatim)."""
    from tests.app import store_v0

    return store_v0


def test_a_database_of_the_previous_version_migrates_with_nothing_lost(tmp_path,
                                                                       old_store_module):
    path = tmp_path / FILE_NAME
    old = old_store_module.ConversationStore(path)
    settings = ChatSettings(system_prompt="Be brief.", temperature=0.3)
    a = old.create_conversation("Quantization questions", settings)
    written = []
    for i in range(6):
        m = old.add_message(a.id, ("user", "assistant")[i % 2], f"turn {i} about nf4 and awq")
        written.append(m)
    old.finish_message(written[-1].id, "the last answer, finished", "done", "eos")
    b = old.create_conversation("Cooking")
    old.add_message(b.id, "user", "a recipe for lentil soup")
    old.add_message(b.id, "assistant", "partial", "streaming")  # the old app was killed here
    old.close()
    with closing(sqlite3.connect(path)) as db:
        before = db.execute("SELECT id, conversation_id, role, content, status FROM messages "
                            "ORDER BY id").fetchall()
        assert db.execute("PRAGMA user_version").fetchone()[0] == 0

    store = ConversationStore(path)
    assert store.num_interrupted == 1
    assert [(c.id, c.title) for c in store.conversations()] == [(b.id, "Cooking"),
                                                                 (a.id, "Quantization questions")]
    assert store.conversation(a.id).settings == settings
    shown = store.messages(a.id)
    assert [m.id for m in shown] == [m.id for m in written]  # the same line, in order
    assert shown[-1].content == "the last answer, finished"
    assert [m.parent_id for m in shown] == [None] + [m.id for m in written[:-1]]
    assert all(m.num_alternatives == 1 for m in shown)
    after = [(m.id, m.conversation_id, m.role, m.content, m.status)
             for cid in (a.id, b.id) for m in store.messages(cid)]
    assert sorted(after) == [r if r[4] != "streaming" else (*r[:4], "interrupted")
                             for r in before]
    # the old messages are in the new search index
    assert [h.conversation.id for h in store.search("lentil")] == [b.id]
    assert [h.conversation.id for h in store.search("awq")] == [a.id]
    # and the tree works on them: an alternative of the last answer
    alternative = store.add_message(a.id, "assistant", "another answer",
                                    parent_id=written[-2].id)
    assert [m.id for m in store.messages(a.id)][-1] == alternative.id
    store.close()
    store = ConversationStore(path)  # a second opening migrates nothing again
    assert store.messages(a.id)[-1].id == alternative.id
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == store_schema.VERSION
    store.close()


def test_answers_that_kept_their_thinking_in_tags_migrate_with_it_apart(tmp_path,
                                                                          old_store_module):
    """The engine's reader splits them, a reply that starts inside the thinking too."""
    path = tmp_path / FILE_NAME
    old = old_store_module.ConversationStore(path)
    cid = old.create_conversation("Thinking").id
    old.add_message(cid, "user", "<think> typed by the user stays</think>")
    old.add_message(cid, "assistant", "<think>\nweigh it\n</think>\n\nThe answer.")
    old.add_message(cid, "user", "again")
    old.add_message(cid, "assistant", "the template opened it</think>Answer")
    old.add_message(cid, "user", "and once more")
    old.add_message(cid, "assistant", "no tags")
    old.close()
    store = ConversationStore(path)
    got = [(m.content, m.reasoning) for m in store.messages(cid)]
    store.close()
    assert got == [("<think> typed by the user stays</think>", ""),
                   ("The answer.", "weigh it"), ("again", ""),
                   ("Answer", "the template opened it"), ("and once more", ""),
                   ("no tags", "")]


def test_a_migration_that_fails_leaves_the_file_as_it_was(tmp_path, old_store_module,
                                                          monkeypatch):
    path = tmp_path / FILE_NAME
    old = old_store_module.ConversationStore(path)
    cid = old.create_conversation("kept").id
    old.add_message(cid, "user", "hello")
    old.close()
    from app.history import store_schema

    def broken(db, ids=None):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(store_schema, "link_in_order", broken)
    with pytest.raises(sqlite3.OperationalError):
        ConversationStore(path)
    with closing(sqlite3.connect(path)) as db:
        columns = {r[1] for r in db.execute("PRAGMA table_info(messages)")}
        assert "parent_id" not in columns and db.execute(
            "SELECT content FROM messages").fetchall() == [("hello",)]


def test_alternatives_and_the_one_shown_survive_a_restart(tmp_path):
    path = tmp_path / FILE_NAME
    store = ConversationStore(path)
    cid = store.create_conversation().id
    question = store.add_message(cid, "user", "name a colour")
    first = store.add_message(cid, "assistant", "red")
    follow_up = store.add_message(cid, "user", "why red?")
    second = store.add_message(cid, "assistant", "blue", parent_id=question.id)
    assert [m.content for m in store.messages(cid)] == ["name a colour", "blue"]
    last = store.messages(cid)[-1]
    assert (last.alternative, last.num_alternatives) == (2, 2)
    store.show_alternative(first.id)
    store.close()

    store = ConversationStore(path)
    shown = store.messages(cid)
    assert [m.content for m in shown] == ["name a colour", "red", "why red?"]  # its own branch
    assert (shown[1].alternative, shown[1].num_alternatives) == (1, 2)
    assert store.alternatives(first.id) == [first.id, second.id]
    store.delete_messages_after(cid, question.id)  # an edit drops every branch after it
    assert [m.id for m in store.messages(cid)] == [question.id]
    assert store.message(follow_up.id) is None and store.message(second.id) is None
    store.close()


def test_search_finds_words_across_conversations_and_titles(store):
    a = store.create_conversation("Travel plans")
    store.add_message(a.id, "user", "What should I pack for Reykjavik in winter?")
    b = store.create_conversation("Code")
    store.add_message(b.id, "user", "Why is my quantized model slower?")
    answer = store.add_message(b.id, "assistant", "")
    store.set_content(answer.id, "Dequantization costs time on every step.")  # as it streams
    assert [h.conversation.id for h in store.search("reykjavik")] == [a.id]
    assert [h.conversation.id for h in store.search("quant")] == [b.id]  # a word's start
    assert [h.conversation.id for h in store.search("dequantization step")] == [b.id]
    assert "Dequantization" in store.search("dequantization")[0].snippet
    assert [h.conversation.id for h in store.search("travel")] == [a.id]  # the title
    assert store.search("reykjavik quantized") == []  # every word, in one conversation
    for hostile in ('"', "AND", "NEAR(", "*", "a OR b -c", "'; DROP TABLE messages; --"):
        store.search(hostile)  # the user's text is never FTS5 syntax: no error
    store.delete_conversation(a.id)
    assert store.search("reykjavik") == []


def test_export_and_reimport_round_trip(qtbot, make_window, tmp_path):
    window = make_window()
    controller, sidebar = window.controller, window.conversation_list
    cid = controller.conversation.id
    controller.update_settings(cid, ChatSettings(system_prompt="You answer in French."))
    store = window.store
    store.add_message(cid, "user", "Bonjour ?")
    answer = store.add_message(cid, "assistant", "", "streaming")
    store.finish_message(answer.id, "Bonjour ! ```py\nx = 1\n```", "done",
                         reasoning="greet back", thinking_s=0.5)
    store.rename_conversation(cid, "Salut")
    md, js = tmp_path / "chat.md", tmp_path / "chat.json"
    assert sidebar.export_conversation(cid, md, "md")
    assert sidebar.export_conversation(cid, js, "json")
    text = md.read_text()
    assert text.startswith("# Salut\n") and "**System**\n\nYou answer in French." in text
    assert "**You**\n\nBonjour ?" in text and "x = 1" in text
    exported = json.loads(js.read_text())
    assert exported == {"title": "Salut", "messages": [
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": "Bonjour ?"},
        {"role": "assistant", "content": "Bonjour ! ```py\nx = 1\n```"}]}

    imported = sidebar.import_file(js)
    assert imported is not None and imported.id != cid
    assert controller.conversation.id == imported.id  # shown at once
    assert store.conversation(imported.id).title == "Salut"
    assert store.conversation(imported.id).settings.system_prompt == "You answer in French."
    again = [{"role": m.role, "content": m.content} for m in store.messages(imported.id)]
    assert again == exported["messages"][1:]
    assert sidebar.message_label.isVisibleTo(sidebar) and "Imported" in sidebar.message_label.text()
    assert sidebar.list.currentItem().text() == "Salut"


HOSTILE = {
    "not json": (b"{'messages': []}", "not valid JSON"),
    "not utf-8": (b'{"messages": [{"role": "user", "content": "\xff"}]}', "not UTF-8"),
    "no messages": (b'{"title": "x"}', "no \"messages\" list"),
    "empty": (b'{"messages": []}', "holds no messages"),
    "a tool role": (b'{"messages": [{"role": "user", "content": "hi"}, '
                    b'{"role": "tool", "content": "rm -rf"}]}', "has the role 'tool'"),
    "no content": (b'{"messages": [{"role": "user", "content": 5}]}', "has no text content"),
    "an image part": (b'{"messages": [{"role": "user", "content": [{"type": "image_url", '
                      b'"image_url": {"url": "http://x"}}]}]}', "other than text"),
    "lone surrogate": (b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
                       "lone surrogate"),
    "nul": (b'{"messages": [{"role": "user", "content": "a\\u0000b"}]}', "NUL"),
    "deep": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "late system": (b'{"messages": [{"role": "user", "content": "hi"}, '
                    b'{"role": "system", "content": "obey"}]}', "after the conversation began"),
    "title not text": (b'{"title": [1], "messages": [{"role": "user", "content": "hi"}]}',
                       "title"),
    "a list of strings": (b'["hi", "there"]', "not an object"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_or_malformed_import_is_refused_whole_in_one_sentence(qtbot, make_window,
                                                                        tmp_path, case):
    data, words = HOSTILE[case]
    window = make_window(load=False)
    store, sidebar = window.store, window.conversation_list
    window.controller.show_latest_or_new()
    path = tmp_path / "evil.json"
    path.write_bytes(data)
    before = [(c.id, c.title) for c in store.conversations()]
    with closing(sqlite3.connect(store.path)) as db:
        num_messages = db.execute("SELECT count(*) FROM messages").fetchone()[0]
    assert sidebar.import_file(path) is None
    message = sidebar.message_label.text()
    assert words in message and message.startswith("Not imported: ") and "evil.json" in message
    assert "\n" not in message and message.count(". ") == 0  # one sentence
    assert [(c.id, c.title) for c in store.conversations()] == before  # nothing half-imported
    with closing(sqlite3.connect(store.path)) as db:
        assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == num_messages


def test_an_import_larger_than_any_conversation_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(conversation_export, "MAX_IMPORT_BYTES", 1000)
    with pytest.raises(ImportRefused, match="larger than"):
        conversation_export.parse_json(b" " * 1001, "big.json")


def test_a_failure_midway_through_an_import_keeps_nothing(store, monkeypatch):
    before = store.conversations()
    messages = (("user", "one"), ("assistant", "two"), ("user", "three"))
    real_execute = store._db.execute
    calls = []

    def failing(sql, *args):
        if sql.startswith("INSERT INTO messages"):
            calls.append(sql)
            if len(calls) == 3:
                raise sqlite3.OperationalError("database or disk is full")
        return real_execute(sql, *args)

    monkeypatch.setattr(store, "_db", type("Db", (), {"execute": staticmethod(failing)})())
    with pytest.raises(sqlite3.OperationalError):
        store.import_conversation("half", ChatSettings(), messages)
    monkeypatch.undo()
    assert store.conversations() == before
    assert store._db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0


def test_the_sidebar_searches_across_conversations(qtbot, make_window):
    window = make_window(load=False)
    store, sidebar, controller = window.store, window.conversation_list, window.controller
    a = store.create_conversation("Holidays")
    store.add_message(a.id, "user", "Which ferry goes to Orkney?")
    b = store.create_conversation("Rust")
    store.add_message(b.id, "user", "How do lifetimes work?")
    controller.show_latest_or_new()
    sidebar.search_edit.setText("orkney")
    assert sidebar.list.count() == 1
    item = sidebar.list.item(0)
    assert item.text().startswith("Holidays\n") and "Orkney" in item.text()
    sidebar.list.setCurrentItem(item)
    assert controller.conversation.id == a.id  # a hit opens its conversation
    sidebar.search_edit.setText("nothing like this")
    assert sidebar.list.count() == 0
    sidebar.search_edit.clear()
    assert sidebar.list.count() == len(store.conversations())
