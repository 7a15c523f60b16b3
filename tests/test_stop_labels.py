"""A reply's stop label ("cut at max_new_tokens", "stopped (Esc)") is stored with it and comes back
with the chat: --resume and /load in the real app; a v1 store (no stop column) still opens."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from tui_pilot import endless, make_app, ready, submit

from chatapp.chat.events import TextDelta
from chatapp.store.database import ChatStore

SIZE = (100, 30)
LEGACY = Path(__file__).parent / "data" / "legacy_store"


def labels(app) -> list[str]:
    return [str(ex.reply.border_subtitle or "") for ex in app.transcript.exchanges]


@pytest.mark.anyio
async def test_stop_labels_come_back_with_resume_and_load():
    app = make_app("--temperature", "0", "--max-new-tokens", "3")
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        endless(app)  # only the length limit or the cancel ends a reply
        await submit(pilot, "one")
        assert app.session.turn_stats[-1].stop == "length"
        events = app.keeper.send("two")  # the keeper's own path, cancelled as Esc cancels it
        for ev in events:
            if isinstance(ev, TextDelta):
                app.keeper.cancel()
        assert app.session.exchanges[-1].stop == "cancel"
        chat_id = app.keeper.chat_id
        await submit(pilot, "/reset")  # a reply that ended by itself is stored too: nothing to label
        await submit(pilot, "other chat")
    want = ["cut at max_new_tokens", "stopped (Esc)"]

    again = make_app("--chat", str(chat_id))
    async with again.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert labels(again) == want
        await submit(pilot, "/reset")
        assert labels(again) == []
        await submit(pilot, f"/load {chat_id}")
        assert labels(again) == want


def test_a_v1_store_opens_gains_the_column_and_reads_read_only(tmp_path):
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    shutil.copytree(LEGACY, ro)
    shutil.copytree(LEGACY, rw)
    store = ChatStore(ro, read_only=True)  # cannot be upgraded: read as v1
    assert [m.stop for m in store.get(1).messages] == [""] * 4 and not store.get(1).damage
    store.close()
    store = ChatStore(rw)
    chat = store.get(1)
    assert [m.stop for m in chat.messages] == [""] * 4 and not chat.damage
    chat.messages[-1].stop = "length"
    store.save(chat)
    assert store.get(1).messages[-1].stop == "length"
    store.close()
    db = sqlite3.connect(rw / "chats.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    db.execute("UPDATE messages SET stop = 'sideways' WHERE seq = 1")
    db.commit()
    db.close()
    chat = ChatStore(rw).get(1)
    assert chat.messages[1].stop == "" and chat.damage == ["message 2: stop is 'sideways', not a stop reason"]


def test_a_v1_store_locked_at_open_saves_stops_once_another_process_upgrades_it(tmp_path):
    """The stop column is read once at open; a v1 store that was locked then is asked again at
    each save, so the upgrade another process makes later is used (the stop is kept)."""
    shutil.copytree(LEGACY, tmp_path / "s")
    lock = sqlite3.connect(tmp_path / "s" / "chats.db", isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")   # another process writing: the upgrade at open must wait
    early = ChatStore(tmp_path / "s", timeout=0.05)
    lock.execute("ROLLBACK")
    lock.close()
    assert early.stop_column() == "''"   # opened as v1
    ChatStore(tmp_path / "s").close()     # the next process upgrades it
    chat = early.get(1)
    chat.messages[-1].stop = "length"
    early.save(chat)
    assert early.get(1).messages[-1].stop == "length"
    early.close()
