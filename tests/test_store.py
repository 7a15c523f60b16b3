"""The chats database and the keeper that saves into it: real SQLite files, real sessions."""

import os
import sqlite3
from pathlib import Path

import pytest

from chatapp.chat.events import Error, Info, TurnStats
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper, Saved
from chatapp.keeper.reopen import Restored
from chatapp.store.database import ChatStore, chats_dir, data_home
from chatapp.store.records import ChatRecord, StoredMessage, StoreError
from model.errors import UserError


def chat(title="t", n=2) -> ChatRecord:
    msgs = []
    for i in range(n):
        msgs += [StoredMessage("user", f"q{i}", [1, 2, i]), StoredMessage("assistant", f"a{i}", [3, i], [{"expr": "1+1",
                                                                                            "result": "2"}])]
    return ChatRecord(title, "random:tiny", "fp", "tfp", {"temperature": 0.0}, "sys", [9, 9], 17, msgs)


def turns(events) -> list[TurnStats]:
    return [e for e in events if isinstance(e, TurnStats)]


@pytest.fixture
def store(tmp_path):
    s = ChatStore(tmp_path / "chats")
    yield s
    s.close()


@pytest.fixture
def keeper(tiny, store):
    return ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=6), context=512), store)


def test_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("NANOCHAT_TUI_CHATS")
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(tmp_path / "home"))
    assert chats_dir() == tmp_path / "home" / "chats"
    monkeypatch.delenv("NANOCHAT_TUI_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_home() == tmp_path / "xdg" / "nanochat-tui"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert data_home() == Path("~/.local/share/nanochat-tui").expanduser()


def test_save_get_list_rename_delete(store):
    a = chat("first")
    a_id = store.save(a)
    b_id = store.save(chat("second", n=1))
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    got = store.get(a_id)
    assert (got.title, got.messages, got.prefix_tokens, got.cache_seqlens) == ("first", a.messages, [9, 9], 17)
    assert got.settings == {"temperature": 0.0} and got.created > 0
    assert [c.id for c in store.list()] == [b_id, a_id]  # most recent first
    assert store.latest_id() == b_id and store.latest_id(exclude=b_id) == a_id
    a.messages = a.messages[:2]
    store.save(a)  # same id: replaces the messages, keeps created
    assert store.get(a_id).messages == a.messages and store.get(a_id).created == got.created
    store.rename(a_id, "  renamed   chat ")
    assert store.get(a_id).title == "renamed chat"
    with pytest.raises(StoreError, match="empty"):
        store.rename(a_id, "  ")
    store.snapshot_dir(a_id).mkdir(parents=True)
    store.delete(a_id)
    assert store.get(a_id) is None and not store.snapshot_dir(a_id).exists()
    assert store.db.execute("SELECT COUNT(*) FROM messages WHERE chat_id = ?", (a_id,)).fetchone()[0] == 0
    assert store.save(chat("third")) > b_id  # ids are never reused
    assert store.integrity_check() == "ok"


def test_keeper_saves_every_turn_before_reporting_it(keeper, store):
    seen = []
    for ev in keeper.send("hello there"):
        if isinstance(ev, TurnStats):  # the turn is already committed when it is reported
            seen.append(ChatStore(store.root).get(keeper.chat_id))
    (stored,) = seen
    s = keeper.session
    assert [m.content for m in stored.messages] == ["hello there", s.exchanges[0].reply]
    assert stored.prefix_tokens + stored.messages[0].token_ids + stored.messages[1].token_ids == s.tokens
    assert stored.title == "hello there" and stored.cache_seqlens == s.cache.seqlen


def test_reset_starts_a_new_chat_and_keeps_the_old(keeper, store):
    list(keeper.send("one"))
    first = keeper.chat_id
    list(keeper.run_command("/reset"))
    assert keeper.chat_id is None and len(store.list()) == 1  # an empty chat is not stored
    list(keeper.send("two"))
    assert keeper.chat_id != first and len(store.list()) == 2
    list(keeper.send("three"))
    list(keeper.run_command("/undo"))
    assert [m.content for m in store.get(keeper.chat_id).messages] == ["two", keeper.session.exchanges[0].reply]
    assert [m.content for m in store.get(first).messages][0] == "one"  # undo is saved too, in its own chat


def test_undo_to_nothing_deletes_the_chat_and_the_next_message_starts_a_new_one(keeper, store):
    list(keeper.send("kept elsewhere"))
    other = keeper.chat_id
    list(keeper.run_command("/reset"))
    list(keeper.send("regretted"))
    list(keeper.send("this too"))
    emptied, title = keeper.chat_id, keeper.title
    assert title == "regretted" and store.snapshot_dir(emptied).is_dir()
    list(keeper.run_command("/undo"))
    assert [m.content for m in store.get(emptied).messages][::2] == ["regretted"]  # not empty yet: kept
    (state, info) = list(keeper.run_command("/undo"))
    assert state.event == "undo" and isinstance(info, Info) and info.data == {"deleted": emptied}
    assert store.get(emptied) is None and not store.snapshot_dir(emptied).exists()
    assert keeper.chat_id is None and [c.id for c in store.list()] == [other]  # nothing else went
    assert [m.content for m in store.get(other).messages][0] == "kept elsewhere"
    (err,) = list(keeper.run_command("/undo"))  # nothing left to undo: nothing else happens
    assert isinstance(err, Error) and [c.id for c in store.list()] == [other]

    list(keeper.send("a fresh start"))  # the same window: a new chat, titled by its own first message
    assert keeper.chat_id not in (None, emptied, other) and keeper.title == "a fresh start"
    stored = store.get(keeper.chat_id)
    assert [m.content for m in stored.messages] == ["a fresh start", keeper.session.exchanges[0].reply]
    assert stored.cache_seqlens == keeper.session.cache.seqlen and store.snapshot_dir(keeper.chat_id).is_dir()
    assert len(store.list()) == 2


def test_undo_to_nothing_keeps_named_reopened_and_trimmed_chats(tiny, store):
    """Only a chat this window autosaved goes when the undo empties it: one /save'd (empty or
    not) stays, one reopened with /load stays, and so does one whose earlier exchanges a trim
    moved out of the context (they are still its messages)."""
    k = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=6)), store)
    list(k.run_command("/save Notes"))
    list(k.run_command("/undo"))
    assert store.get(k.chat_id).title == "Notes"
    named = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=6)), store)
    list(named.send("a note"))
    list(named.run_command("/save Project"))  # named on purpose: the user keeps it, even emptied
    list(named.run_command("/undo"))
    assert store.get(named.chat_id).title == "Project" and store.get(named.chat_id).messages == []
    reopened = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=6)), store)
    list(reopened.send("from an earlier session"))
    old = reopened.chat_id
    again = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=6)), store)
    list(again.run_command(f"/load {old}"))
    list(again.run_command("/undo"))  # a chat reopened, then emptied: stays, as a chat the user had
    assert store.get(old) is not None and again.chat_id == old
    small = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=6), context=128), store)
    list(small.send("a first message that the next one pushes out of the context"))
    list(small.send("x" * 70))
    assert small.session.trimmed and len(small.session.exchanges) == 1
    list(small.run_command("/undo"))
    archived = store.get(small.chat_id).messages
    assert [m.content for m in archived][0].startswith("a first message") and len(archived) == 2


def test_undo_to_nothing_leaves_a_chat_another_window_changed(tiny, store):
    a = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=6), context=512), store)
    b = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=6), context=512),
                   ChatStore(store.root))
    list(a.send("first, from A"))
    list(b.run_command(f"/load {a.chat_id}"))
    list(a.send("second, from A"))
    events = list(b.run_command("/undo"))  # B empties its copy; A's turns are still in the store
    (info,) = [e for e in events if isinstance(e, Info)]
    assert "another window" in info.text and b.chat_id is None
    assert [m.content for m in store.get(a.chat_id).messages][::2] == ["first, from A", "second, from A"]
    assert len(store.list()) == 1  # B had nothing left to keep: no empty copy of the chat


def test_save_title_export_and_no_store(keeper, tiny, tmp_path):
    list(keeper.send("hello"))
    (saved,) = list(keeper.run_command("/save  My   chat"))
    assert isinstance(saved, Saved) and saved.title == "My chat"
    assert saved.snapshot_tokens == keeper.session.cache.seqlen
    (info,) = list(keeper.run_command(f"/export {tmp_path}"))
    assert isinstance(info, Info)
    text = Path(info.data["path"]).read_text()
    assert text.startswith("# My chat\n") and "## User\n\nhello\n" in text
    assert f"## Assistant\n\n{keeper.session.exchanges[0].reply.rstrip()}" in text
    list(keeper.send("more"))
    (info,) = list(keeper.run_command(f"/export {info.data['path']}"))  # an earlier export is updated
    assert "## User\n\nmore\n" in Path(info.data["path"]).read_text()
    notes = tmp_path / "notes.md"
    notes.write_text("my own notes\n")
    (err,) = list(keeper.run_command(f"/export {notes}"))  # anything else is left alone
    assert isinstance(err, Error) and "exists and is not an earlier export" in err.message
    assert notes.read_text() == "my own notes\n"
    bare = ChatKeeper(Session(tiny, Settings(max_new_tokens=2)), None)
    for cmd in ("/save", "/load 1"):
        (err,) = list(bare.run_command(cmd))
        assert isinstance(err, Error) and "not stored" in err.message and "--no-store" in err.message
    (err,) = list(bare.run_command("/export /no/such/dir/x.md"))
    assert isinstance(err, Error) and "cannot write" in err.message


def test_locked_database_reports_each_failure_loses_nothing_and_catches_up(tiny, tmp_path):
    store = ChatStore(tmp_path, timeout=0.1)
    keeper = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=4)), store)
    list(keeper.send("before the lock"))
    other = sqlite3.connect(tmp_path / "chats.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    errors = [e for e in keeper.send("while locked") if isinstance(e, Error)]
    assert len(errors) == 1 and "locked by another program" in errors[0].message
    assert "\n" not in errors[0].message
    # said every time (issue 27): each failed save is a turn that is not on disk yet
    assert [e for e in keeper.send("still locked") if isinstance(e, Error)]
    (err,) = list(keeper.run_command("/load 1"))  # switching would drop unsaved turns: refused
    assert "staying in this chat" in err.message
    other.execute("ROLLBACK")
    other.close()
    assert turns(keeper.send("unlocked"))
    stored = [m.content for m in store.get(keeper.chat_id).messages if m.role == "user"]
    assert stored == ["before the lock", "while locked", "still locked", "unlocked"]


def test_read_only_database_still_lists_and_opens(tiny, tmp_path):
    rw = ChatStore(tmp_path)
    keeper = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=4)), rw)
    list(keeper.send("kept"))
    rw.close()
    if os.geteuid() != 0:  # root writes anyway; then the explicit read-only mode stands in
        os.chmod(tmp_path / "chats.db", 0o444)
    ro = ChatStore(tmp_path, read_only=True if os.geteuid() == 0 else None)
    k2 = ChatKeeper(Session(tiny, Settings(max_new_tokens=4)), ro)
    restored, errors = k2.open(keeper.chat_id)
    assert isinstance(restored, Restored) and restored.restored_tokens == keeper.session.cache.seqlen
    assert errors == []  # opening changes nothing: there is nothing to say yet
    events = list(k2.send("more"))
    assert turns(events) and not [e for e in events if isinstance(e, Error)]
    (note,) = [e for e in events if isinstance(e, Info)]  # the first change says it, once
    assert note.data == {"read_only": True} and "nothing will be saved" in note.text and "\n" not in note.text
    assert not [e for e in k2.send("again") if isinstance(e, (Info, Error))]
    (err,) = [e for e in k2.run_command("/save") if isinstance(e, Error)]  # an explicit save says it again
    assert "read-only" in err.message
    assert [m.content for m in ro.get(keeper.chat_id).messages][0] == "kept"


def test_unwritable_chats_dir_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match="cannot open the chats database") as e:
        ChatStore(blocker / "chats")
    assert "\n" not in str(e.value)


def test_snapshot_write_failure_keeps_the_chat(keeper, store):
    list(keeper.send("first"))
    folder = store.snapshot_dir(keeper.chat_id)
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()
    folder.write_text("a file where the snapshot folder goes: writes fail like on a full disk")
    events = list(keeper.send("second"))
    (err,) = [e for e in events if isinstance(e, Error)]
    assert err.message.startswith("KV snapshot not written") and "re-prefilled" in err.message
    assert len(store.get(keeper.chat_id).messages) == 4


def test_a_chat_longer_than_the_context_is_refused_and_nothing_changes(keeper, tiny, store):
    for i in range(4):
        list(keeper.send(f"a fairly long message number {i} to fill the cache"))
    small = ChatKeeper(Session(tiny, Settings(max_new_tokens=4), context=128), store)
    list(small.send("mine"))
    before = list(small.session.tokens)
    (err,) = list(small.run_command(f"/load {keeper.chat_id}"))
    assert isinstance(err, Error) and "more than this cache's 128" in err.message and "--context" in err.message
    assert small.session.tokens == before and small.chat_id != keeper.chat_id


def test_snapshots_past_the_budget_go_oldest_first_never_the_open_chat(store):
    ids = [store.save(chat(f"c{i}")) for i in range(3)]
    for cid in ids:
        store.snapshot_dir(cid).mkdir(parents=True)
        (store.snapshot_dir(cid) / "00000000-00000010.safetensors").write_bytes(b"x" * 1000)
    assert store.prune_snapshots(keep=ids[0], budget_bytes=2500) == [ids[1]]  # ids[0] is oldest but open
    assert store.snapshot_dir(ids[0]).exists() and store.snapshot_dir(ids[2]).exists()
    assert store.prune_snapshots(keep=ids[2], budget_bytes=5000) == []


def test_lone_surrogates_are_refused_and_the_store_stays_usable(keeper, store):
    """A lone surrogate (a JSON escape, a paste) cannot be stored: refused before it gets in,
    and a failed write never leaves the database locked."""
    list(keeper.send("hello"))
    bad = "bad \ud800 text"
    for events in (keeper.send(bad), keeper.run_command("/system " + bad), keeper.run_command("/save " + bad)):
        (err,) = [e for e in events if isinstance(e, Error)]
        assert "lone surrogate" in err.message
    with pytest.raises(StoreError):
        store.rename(keeper.chat_id, bad)
    assert not store.db.in_transaction
    events = list(keeper.send("still fine"))
    assert not [e for e in events if isinstance(e, Error)]
    stored = ChatStore(store.root).get(keeper.chat_id)
    assert [m.content for m in stored.messages][::2] == ["hello", "still fine"]


def test_two_windows_on_one_chat_lose_nothing(tiny, store):
    """Window B opens A's chat; both go on. A's turn must not be overwritten by B's save:
    B's conversation continues as a new chat and says so."""
    a = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=6), context=512), store)
    b = ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=6), context=512),
                   ChatStore(store.root))
    list(a.send("first, from A"))
    list(b.run_command(f"/load {a.chat_id}"))
    assert b.chat_id == a.chat_id
    list(a.send("second, from A"))
    events = list(b.send("second, from B"))
    (fork,) = [e for e in events if isinstance(e, Info) and "another window" in e.text]
    assert b.chat_id != a.chat_id and fork.data == {"forked_from": a.chat_id, "chat": b.chat_id}
    users = lambda k: [m.content for m in ChatStore(store.root).get(k.chat_id).messages][::2]  # noqa: E731
    assert users(a) == ["first, from A", "second, from A"]
    assert users(b) == ["first, from A", "second, from B"]
    list(b.send("third, from B"))  # B now owns its own chat: no more forks
    assert users(b) == ["first, from A", "second, from B", "third, from B"]
    list(a.send("third, from A"))
    assert users(a) == ["first, from A", "second, from A", "third, from A"]


def test_the_chats_screen_renames_and_deletes_through_the_keeper(keeper, store):
    """The open chat takes its new title at once and stays saved (no stale title written back,
    nothing unsaved at exit); the open chat is refused deletion; another one goes, snapshot too."""
    other = store.save(chat("other"))
    list(keeper.send("hi"))
    mine = keeper.chat_id
    assert mine is not None and not keeper.unsaved()
    keeper.rename_chat(mine, "  my   notes ")
    assert keeper.title == store.get(mine).title == "my notes" and not keeper.unsaved()
    list(keeper.send("more"))  # the next save keeps the new title
    assert store.get(mine).title == "my notes"
    keeper.rename_chat(other, "theirs")
    assert store.get(other).title == "theirs" and keeper.title == "my notes"
    with pytest.raises(StoreError, match="cannot be empty"):
        keeper.rename_chat(other, "   ")
    with pytest.raises(UserError, match=f"chat #{mine} is open here"):
        keeper.delete_chat(mine)
    store.snapshot_dir(other).mkdir(parents=True)
    keeper.delete_chat(other)
    assert store.get(other) is None and not store.snapshot_dir(other).exists() and store.get(mine) is not None
    assert [c.id for c in keeper.chats()[0]] == [mine] and keeper.chats("notes")[1] == {mine}
    with pytest.raises(UserError, match=r"not stored in this session \(--no-store\)"):
        ChatKeeper(keeper.session, None).rename_chat(mine, "x")
