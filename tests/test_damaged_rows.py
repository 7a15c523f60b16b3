"""Issue 27 item 4: the store survives bad rows. Every cell is validated on read; a chat with a
corrupt cell is listed as damaged, opens from its text with a note, crashes nothing, and is not
rewritten until the user changes it; every other chat still opens, --resume included."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from chatapp.chat.events import Restored, TurnStats
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from chatapp.store.database import ChatStore

DEEP = "[" * 100_000 + "]" * 100_000
# (table, column, bad value): each one a traceback on --resume before issue 27
CELLS = [
    ("chats", "settings", "{not json"), ("chats", "settings", DEEP),
    ("chats", "settings", json.dumps({"temperature": "hot"})), ("chats", "prefix_tokens", '"text"'),
    ("chats", "prefix_tokens", DEEP), ("chats", "cache_pos", "many"), ("chats", "title", b"\x80abc"),
    ("messages", "token_ids", '["a", "b"]'), ("messages", "token_ids", "9" * 5000),
    ("messages", "tool_calls", '[{"x": 1}]'), ("messages", "content", b"\xff\xfe"),
]


def keeper_on(tiny, store) -> ChatKeeper:
    return ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=2), context=256), store)


@pytest.fixture(scope="module")
def base_store(tiny, tmp_path_factory):
    """Two stored chats, made once; each test works on a copy of the database."""
    root = tmp_path_factory.mktemp("two-chats")
    store = ChatStore(root)
    ids = []
    for text in ("the good chat", "the damaged chat"):
        k = keeper_on(tiny, store)
        assert [e for e in k.send(text) if isinstance(e, TurnStats)]
        ids.append(k.chat_id)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    return root / "chats.db", ids


@pytest.fixture
def two_chats(base_store, tmp_path):
    db, ids = base_store
    shutil.copy(db, tmp_path / "chats.db")
    return ChatStore(tmp_path), ids


def test_each_corrupt_cell_is_noted_opens_from_its_text_and_rewrites_nothing(tiny, base_store, tmp_path):
    """One loop over the cells (each on a fresh copy of the store): a test per cell cost more
    in fixtures than in the opens themselves."""
    db, (good, damaged) = base_store
    for n, (table, column, bad) in enumerate(CELLS):
        (tmp_path / str(n)).mkdir()
        shutil.copy(db, tmp_path / str(n) / "chats.db")
        store = ChatStore(tmp_path / str(n))
        key = "id" if table == "chats" else "chat_id"
        store.db.execute(f"UPDATE {table} SET {column} = ? WHERE {key} = ?", (bad, damaged))
        raw = store.db.execute(f"SELECT {column} FROM {table} WHERE {key} = ?", (damaged,)).fetchall()
        chat = store.get(damaged)
        assert chat.damage and all("\n" not in d for d in chat.damage), (table, column)
        restored, errors = keeper_on(tiny, store).open(damaged)
        assert not errors and "damaged row" in restored.detail, (table, column)
        assert store.db.execute(f"SELECT {column} FROM {table} WHERE {key} = ?",
                                (damaged,)).fetchall() == raw, f"{table}.{column} was rewritten"
        store.close()


@pytest.mark.parametrize("table, column, bad", [CELLS[-3], CELLS[-1]], ids=["text-ids", "bytes-content"])
def test_after_the_users_next_message_the_damaged_chat_is_saved_whole_and_the_others_open(tiny, two_chats, table,
                                                                                          column, bad):
    store, (good, damaged) = two_chats
    key = "id" if table == "chats" else "chat_id"
    store.db.execute(f"UPDATE {table} SET {column} = ? WHERE {key} = ?", (bad, damaged))
    k = keeper_on(tiny, store)
    k.open(damaged)
    assert [e for e in k.send("go on") if isinstance(e, TurnStats)]  # the user acts: now it is saved whole
    assert not store.get(damaged).damage and store.get(damaged).messages[-2].content == "go on"
    assert k.chat_id == damaged
    assert isinstance(next(iter(k.run_command(f"/load {good}"))), Restored)


def test_the_list_marks_damaged_chats_and_resume_of_one_never_crashes(tiny, two_chats, tmp_path):
    store, (good, damaged) = two_chats
    store.db.execute("UPDATE messages SET token_ids = ? WHERE chat_id = ?", (DEEP, damaged))
    assert {c.id: c.damaged for c in store.list()} == {good: False, damaged: True}
    r = subprocess.run([sys.executable, "-m", "chatapp.cli", "--headless", "--model", "random:tiny", "--resume"],
                       input="", capture_output=True, text=True, timeout=120,
                       env={**os.environ, "NANOCHAT_TUI_CHATS": str(tmp_path)})
    ready = json.loads(r.stdout.splitlines()[0])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert ready["chat"] == damaged and "damaged row" in ready["restore_detail"]
