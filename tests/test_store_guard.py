"""Issue 45 finding 11: the store defends its own file. Whoever can write the data directory
can hand the app any SQLite file; at open it refuses, in one line naming the file, what this
app did not create, and it never loads a cell past the cap (chatapp/store/guard.py)."""

from __future__ import annotations

import os
import sqlite3

import pytest

from chatapp.store.database import ChatStore
from chatapp.store.guard import MAX_CELL_BYTES
from chatapp.store.records import ChatRecord, StoredMessage, StoreError


def chat(title: str = "t") -> ChatRecord:
    return ChatRecord(title, "random:tiny", "fp", "tfp", {}, "sys", [9], 3,
                      [StoredMessage("user", "hi", [1]), StoredMessage("assistant", "hello", [2], stop="end")])


@pytest.fixture
def stored(tmp_path):
    """A store this app made, holding two chats, closed again."""
    s = ChatStore(tmp_path)
    ids = [s.save(chat("one")), s.save(chat("two"))]
    s.close()
    return tmp_path, ids


def tamper(root, *sql: str) -> None:
    db = sqlite3.connect(root / "chats.db")
    for statement in sql:
        db.execute(statement)
    db.commit()
    db.close()


def refused(root) -> str:
    with pytest.raises(StoreError) as e:
        ChatStore(root)
    msg = str(e.value)
    assert f"{root / 'chats.db'}" in msg and "\n" not in msg
    return msg


HANG = ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r")


@pytest.mark.parametrize("sql, named", [
    (f"CREATE TRIGGER slow BEFORE INSERT ON messages BEGIN {HANG}; END", "trigger 'slow'"),   # hung every save
    ("CREATE TRIGGER wipe AFTER INSERT ON messages BEGIN DELETE FROM messages WHERE chat_id != NEW.chat_id; END",
     "trigger 'wipe'"),                                      # lost other chats while the save was reported
    (f"CREATE VIEW v AS {HANG}", "view 'v'"),
    ("CREATE INDEX big ON messages(printf('%.*c', 1000000000, 'x'))", "index 'big'"),  # 1 GB per insert
    ("CREATE TABLE extra (x)", "table 'extra'"),
], ids=["recursive-trigger", "deleting-trigger", "view", "expression-index", "table"])
def test_triggers_views_and_objects_the_app_did_not_create_are_refused_at_open(stored, sql, named):
    root, _ = stored
    tamper(root, sql)
    assert f"holds {named}" in refused(root)


def test_a_chats_view_in_place_of_the_table_is_refused(stored):
    """--resume hung on a `chats` view computing a recursive CTE."""
    root, _ = stored
    tamper(root, "DROP TABLE chats", f"CREATE VIEW chats AS {HANG}")
    assert "view 'chats'" in refused(root)


def test_a_table_with_other_columns_or_checks_is_refused(stored):
    root, _ = stored
    tamper(root, "ALTER TABLE chats ADD COLUMN g TEXT GENERATED ALWAYS AS (printf('%.*c', 100, 'x')) VIRTUAL")
    assert "columns this app did not create" in refused(root)


def test_a_chats_db_that_is_a_link_is_refused_and_its_target_left_alone(tmp_path):
    """A chats.db linked to another file had SQLite overwrite that file."""
    victim = tmp_path / "notes.txt"
    victim.write_text("my notes\n")
    store = tmp_path / "store"
    store.mkdir()
    (store / "chats.db").symlink_to(victim)
    assert "chats.db is a symbolic link, not a regular file" in refused(store)
    assert victim.read_text() == "my notes\n"
    (store / "chats.db").unlink()
    (store / "chats.db-wal").symlink_to(victim)
    assert "chats.db-wal is a symbolic link" in refused(store)
    assert victim.read_text() == "my notes\n"


def test_a_truncated_database_is_refused_at_open(stored):
    root, _ = stored
    db = sqlite3.connect(root / "chats.db")
    db.execute("PRAGMA journal_mode = DELETE")  # everything in the main file, then cut it
    db.close()
    size = (root / "chats.db").stat().st_size
    with open(root / "chats.db", "r+b") as f:
        f.truncate(size // 2)
    assert "truncated" in refused(root)


def test_a_cell_past_the_cap_is_never_loaded_and_the_chat_opens_noted(stored):
    """600-900 MB cells made --resume take over 60 s at 2-2.8 GB: a cell past the cap is noted
    as damage, unread, and the chats list still lists everything."""
    root, (one, two) = stored
    n = MAX_CELL_BYTES + 1000
    tamper(root, f"UPDATE messages SET content = printf('%.*c', {n}, 'x') WHERE chat_id = {one} AND seq = 1",
           f"UPDATE chats SET title = printf('%.*c', {n}, 't') WHERE id = {two}")
    store = ChatStore(root)
    got = store.get(one)
    assert [m.content for m in got.messages] == ["hi", ""]
    assert got.damage == [f"message 2: content is larger than {MAX_CELL_BYTES >> 20} MiB and was not read"]
    assert store.get(two).title == "untitled" and "title is larger" in store.get(two).damage[0]
    listed = {c.id: c for c in store.list()}
    assert listed[one].messages == 1 and listed[two].title == "(too large to show)" and listed[two].messages == 1
    store.save(got)  # the damaged chat saves again, now without the large cell
    assert store.get(one).damage == []


def test_a_store_this_app_made_still_opens(stored, tmp_path):
    root, ids = stored
    s = ChatStore(root)
    assert sorted(c.id for c in s.list()) == sorted(ids) and s.integrity_check() == "ok"
    assert os.path.getsize(root / "chats.db") > 0
