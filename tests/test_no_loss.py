"""Issue 27 item 0: nothing saved is ever lost, whatever fails. Opening a chat is a transaction,
failed saves are reported every time and caught up, exiting with unsaved turns says so in one line
and keeps a copy, orphan rows are kept. Real SQLite files, real sessions on random:tiny."""

import json
import sqlite3

import pytest
from test_session import assert_invariant

from chatapp.chat.events import Error, Restored, TurnStats
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.final_save import final_save
from chatapp.keeper.keeper import ChatKeeper
from chatapp.keeper.reopen import pairs
from chatapp.store.database import ChatStore
from chatapp.store.records import StoreError


def keeper_on(tiny, store) -> ChatKeeper:
    return ChatKeeper(Session(tiny, Settings(temperature=0.0, max_new_tokens=4), context=512), store)


def chat_with(k: ChatKeeper, *messages: str) -> int:
    for m in messages:
        assert [e for e in k.send(m) if isinstance(e, TurnStats)]
    return k.chat_id


def stored_pairs(store: ChatStore, chat_id: int) -> list[tuple[str, str]]:
    return [(u.content, a.content) for u, a in pairs(store.get(chat_id).messages)]


def test_a_stored_token_id_past_the_vocabulary_opens_from_text_and_overwrites_nothing(tiny, tmp_path):
    """The issue's repro: chat 1 holds token id 10**9; chat 2 is open; /load 1; send."""
    store = ChatStore(tmp_path)
    first = keeper_on(tiny, store)
    one = chat_with(first, "hello one")
    store.db.execute("UPDATE messages SET token_ids = ? WHERE chat_id = ? AND seq = 0", (json.dumps([10**9]), one))
    k = keeper_on(tiny, store)
    two = chat_with(k, "hello two")
    want_one, want_two = stored_pairs(store, one), stored_pairs(store, two)
    events = list(k.run_command(f"/load {one}"))
    restored = next(e for e in events if isinstance(e, Restored))
    assert "past this tokenizer" in restored.detail and k.chat_id == one
    assert_invariant(k.session)
    chat_with(k, "more")
    assert stored_pairs(store, two) == want_two  # chat 2 untouched
    assert stored_pairs(store, one)[:-1] == want_one and stored_pairs(store, one)[-1][0] == "more"


def test_a_failure_after_the_adopt_step_puts_the_old_chat_back_with_its_id(tiny, tmp_path):
    store = ChatStore(tmp_path)
    other = chat_with(keeper_on(tiny, store), "the other chat")
    k = keeper_on(tiny, store)
    mine = chat_with(k, "mine", "mine again")
    tokens, pos = list(k.session.tokens), k.session.cache.seqlen
    want_other, want_mine = stored_pairs(store, other), stored_pairs(store, mine)
    # fault injection: the prefill after the adopt step runs out of memory (the real one can)
    real = k.session.gen.prefill

    def out_of_memory(ids):
        raise RuntimeError("CUDA out of memory (injected)")
    k.session.gen.prefill = out_of_memory
    store_dir = store.snapshot_dir(other)
    for p in store_dir.iterdir():  # no snapshot: the open must prefill
        p.unlink()
    events = list(k.run_command(f"/load {other}"))
    k.session.gen.prefill = real
    errors = [e.message for e in events if isinstance(e, Error)]
    assert len(errors) == 1 and "out of memory" in errors[0] and f"still in chat #{mine}" in errors[0]
    assert k.chat_id == mine and k.session.tokens == tokens
    assert k.session.cache.seqlen == pos  # the old chat's K/V came back from its own snapshot
    assert_invariant(k.session)
    chat_with(k, "after the failure")
    assert stored_pairs(store, other) == want_other
    assert stored_pairs(store, mine)[:2] == want_mine and len(stored_pairs(store, mine)) == 3


def hold_lock(store: ChatStore) -> sqlite3.Connection:
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another program holds the write lock
    return other


def test_failed_saves_are_reported_every_time_and_the_next_save_catches_up(tiny, tmp_path):
    store = ChatStore(tmp_path, timeout=0.05)
    k = keeper_on(tiny, store)
    mine = chat_with(k, "saved first")
    lock = hold_lock(store)
    fails = [[e.message for e in k.send(m) if isinstance(e, Error)] for m in ("second", "third")]
    assert all(len(f) == 1 and "not saved" in f[0] and "locked" in f[0] for f in fails)  # each time, not once
    lock.execute("ROLLBACK")
    assert not [e for e in k.send("fourth") if isinstance(e, Error)]
    assert [u for u, _ in stored_pairs(store, mine)] == ["saved first", "second", "third", "fourth"]
    assert final_save(k) is None


def test_exiting_with_unsaved_turns_says_so_in_one_line_and_keeps_a_copy(tiny, tmp_path):
    store = ChatStore(tmp_path, timeout=0.05)
    k = keeper_on(tiny, store)
    mine = chat_with(k, "on disk")
    lock = hold_lock(store)
    list(k.send("only in memory"))
    line = final_save(k, attempts=2, pause_s=0.01)
    lock.execute("ROLLBACK")
    assert line is not None and "\n" not in line and f"chat #{mine} (2 exchanges) not saved" in line
    copy = line.rsplit(" is in ", 1)[1]
    text = open(copy, encoding="utf-8").read()
    assert "on disk" in text and "only in memory" in text
    assert [u for u, _ in stored_pairs(store, mine)] == ["on disk"]  # the store as it was, not half-written


def test_a_user_row_without_its_reply_is_kept_and_shown(tiny, tmp_path):
    store = ChatStore(tmp_path)
    mine = chat_with(keeper_on(tiny, store), "first", "orphan")
    store.db.execute("DELETE FROM messages WHERE chat_id = ? AND seq = 3", (mine,))  # the last reply row lost
    k = keeper_on(tiny, store)
    restored = next(e for e in k.run_command(f"/load {mine}") if isinstance(e, Restored))
    assert "without their other half" in restored.detail
    assert [ex.user for ex in k.session.exchanges] == ["first", "orphan"]
    assert_invariant(k.session)
    chat_with(k, "third")
    assert [u for u, _ in stored_pairs(store, mine)] == ["first", "orphan", "third"]


def test_a_missing_chat_still_raises_a_store_error(tiny, tmp_path):
    k = keeper_on(tiny, ChatStore(tmp_path))
    with pytest.raises(StoreError):
        k.open(99)
