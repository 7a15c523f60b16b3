"""The chat keeper's saving half: the stored chat kept in step with the session.

`ChatKeeper` (chatapp/keeper/keeper.py, with the commands) is the one chat object the faces talk
to, with or without a store. Faces call `keeper.send(text)` / `keeper.run(command)`
(chatapp/keeper/base.py) and get the session's events. Ordering is the point:
  1. an event that reports a change to the chat arrives (a turn, an undo, a trim, /set, ...),
  2. the whole chat is committed to SQLite,
  3. then the event is handed on (so whatever a face shows is already on disk),
  4. after a turn, the KV snapshot is brought up to date (only the new positions are written).
A failing store (locked, disk full) yields one clear Error; the conversation stays in memory and
the next save writes all of it, so nothing is lost and the chat goes on. A read-only store is
never written: chats list, open and continue in memory, and the first change says once that
nothing will be saved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from safetensors import SafetensorError

from chatapp.chat.attach import chat_title
from chatapp.chat.events import CacheState, Error, Event, Info, Restored, Trimmed, TurnStats
from chatapp.chat.memory import release_freed
from chatapp.chat.reply import EMPTY_FIRST_REPLY
from chatapp.chat.session import Session
from chatapp.keeper.base import Keeper
from chatapp.keeper.reopen import stored_messages
from chatapp.store.database import ChatStore
from chatapp.store.identity import Fingerprint, ModelIdentity, tokenizer_fingerprint
from chatapp.store.records import ChatChanged, ChatRecord, StoreError, describe
from chatapp.store.snapshots import SnapshotWriter


def reports_change(ev: Event) -> bool:
    """Events after which the chat on disk must already match memory. A retry's rewind is the
    start of a turn, not a change of its own: the store keeps the old reply until the new one."""
    match ev:
        case Info(text=text) if text == EMPTY_FIRST_REPLY:  # a note on the turn just committed
            return False
        case TurnStats() | Trimmed() | Info():  # Info: /set's change (a no-op commit for the rest)
            return True
        case CacheState(event=step):
            return step != "retry"
    return False


def default_title(session: Session) -> str:
    return chat_title(session.exchanges[0].user if session.exchanges else None)


class SavingKeeper(Keeper):
    """The state that names the stored chat this window holds, and the commit order."""
    def __init__(self, session: Session, store: ChatStore | None, why_no_store: str = "--no-store"):
        self.session, self.store = session, store
        self.lend_budget()
        self.why_no_store = why_no_store
        self.fingerprint = Fingerprint(session.lm) if store else None
        self._tokenizer_fp: str | None = None
        self.chat_id: int | None = None
        self.title: str | None = None
        self.created = 0.0
        # the chat's messages as we last read or wrote them: a save finding others forks (store.save)
        self.expect: list[tuple[str, str]] | None = None
        self.writer: SnapshotWriter | None = None
        self.clean_upto = 0          # cache positions below this are unchanged since the last snapshot
        self.saved_sig: tuple | None = None
        self.restored: Restored | None = None
        self.last_error = ""
        # created by this window's autosave and never /save'd or opened: only such a chat is
        # deleted when /undo empties it (one the user named or reopened stays, even empty)
        self.ephemeral = False
        self.said_read_only = False

    def lend_budget(self) -> None:
        """The session's /stats shows the store's snapshot budget (None: nothing is stored)."""
        self.session.snapshot_budget = self.store.snapshot_budget if self.store else None

    def after_command(self) -> Iterator[Event]:
        yield from self.write_snapshot()
        release_freed()  # a /model switch or a /retry's turn frees large blocks too

    # --- the turn's ordering ------------------------------------------------------
    def track(self, events: Iterator[Event]) -> Iterator[Event]:
        """Hand on the session's events, committing the chat before any event that reports a
        change to it, and writing the snapshot after each turn."""
        s = self.session
        low = s.cache.seqlen  # a plain turn only appends: positions below this stay as they were
        for ev in events:
            match ev:
                case Trimmed():
                    low = 0  # everything kept moved to new positions
                case TurnStats() if s.exchanges:  # a /retry rewinds to before the reply, re-feeds one token
                    low = min(low, s.exchanges[-1].reply_start - 1)
                case CacheState(event="reset" | "system"):
                    self.detach()  # a new chat: the old one stays stored as it was
            self.clean_upto = min(self.clean_upto, low, s.cache.seqlen)
            errors = list(self.commit()) if reports_change(ev) else []
            yield ev
            yield from errors
            if isinstance(ev, TurnStats):
                yield from self.write_snapshot()
                release_freed()  # the turn's and the snapshot's large temporaries: RSS stays flat
                low = s.cache.seqlen

    def autosave(self) -> Iterator[Event]:
        yield from self.commit()
        yield from self.write_snapshot()

    # --- SQLite -------------------------------------------------------------------
    def signature(self) -> tuple:
        s = self.session
        # cache.seqlen too: a greedy /retry can give back the same tokens with a different pending tail;
        # the trimmed ones too: a trim can leave the same tokens after dropping one more exchange
        return (len(s.tokens), hash(tuple(s.tokens)), s.cache.seqlen, len(s.trimmed),
                repr(dataclasses.asdict(s.settings)), self.title)

    def commit(self, force: bool = False) -> Iterator[Event]:
        """Store the chat if it changed (an empty new chat is not stored unless forced, and one
        this window autosaved is deleted once /undo empties it)."""
        if self.store is None or not (force or self.session.exchanges or self.chat_id is not None):
            return
        if self.store.read_only:
            if self.unsaved() and not self.said_read_only:
                self.said_read_only = True
                yield self.read_only_notice()
            return
        # autosaved with messages, none left: emptied by /undo
        if not force and self.ephemeral and self.expect and not self.session.turns:
            yield from self.drop()
            return
        if not force and self.signature() == self.saved_sig:
            return
        try:
            record = self.record()
            new = self.chat_id is None
            try:
                self.chat_id, self.created = self.store.save(record, self.expect), record.created
            except ChatChanged as e:  # keep both: theirs as it is, ours as a new chat
                old, title = self.chat_id, self.title
                self.detach()
                if not self.session.turns:  # ours is empty: nothing of ours to keep
                    yield Info(f"{e}: it stays as that window left it", {"chat": old})
                    return
                new = True
                self.title = f"{title} (2)" if title else None
                record = self.record()
                self.chat_id, self.created = self.store.save(record), record.created
                yield Info(f"{e}: this conversation continues as chat #{self.chat_id}",
                           {"forked_from": old, "chat": self.chat_id})
            self.expect = [(m.role, m.content) for m in record.messages]
            self.saved_sig = self.signature()
            self.last_error = ""
            self.ephemeral = not force and (new or self.ephemeral)
        except StoreError as e:  # said every time: each failure is a turn not on disk yet
            self.last_error = f"chat not saved: {e}"
            yield Error(f"{self.last_error}; it stays open and the next save will catch up")

    def read_only_notice(self) -> Info:
        assert self.store is not None
        return Info(f"the chats store {self.store.path} is read-only: chats open and continue here, "
                    "but nothing will be saved", {"read_only": True})

    def drop(self) -> Iterator[Event]:
        """Delete the stored chat every exchange of which was undone: an empty chat would linger in
        the chats list. This window goes on as a new chat, stored with its next message."""
        chat_id, expect = self.chat_id, self.expect
        self.detach()  # whatever the store says, this window goes on as a new chat
        try:
            self.store.delete(chat_id, expect)
        except ChatChanged as e:  # another window's turns are in it: theirs to keep
            yield Info(f"{e}: it stays stored as that window left it", {"chat": chat_id})
            return
        except StoreError as e:  # it stays stored, empty
            yield from self.report(f"empty chat #{chat_id} not deleted: {e}")
            return
        self.last_error = ""
        yield Info(f"chat #{chat_id} is empty now, so it is no longer stored", {"deleted": chat_id})

    def record(self) -> ChatRecord:
        s = self.session
        ident = self.identity()
        msgs = stored_messages(s)
        self.title = self.title or default_title(s)
        return ChatRecord(self.title, s.lm.name, ident.digest, self.tokenizer_fp(),
                        dataclasses.asdict(s.settings), s.system, s.tokens[:s.prefix_len], s.cache.seqlen,
                        msgs, self.chat_id, self.created)

    def identity(self) -> ModelIdentity:
        assert self.fingerprint is not None
        return self.fingerprint.get()

    def tokenizer_fp(self) -> str:
        if self._tokenizer_fp is None:
            self._tokenizer_fp = tokenizer_fingerprint(self.session.tokenizer)
        return self._tokenizer_fp

    def report(self, message: str) -> Iterator[Event]:
        if message != self.last_error:  # once per distinct failure, not after every turn
            self.last_error = message
            yield Error(message)

    # --- the KV snapshot ----------------------------------------------------------
    def write_snapshot(self) -> Iterator[Event]:
        if self.store is None or self.store.read_only or self.chat_id is None or self.saved_sig != self.signature():
            return  # the snapshot only ever follows a chat that SQLite holds
        if self.writer is None:
            self.writer = SnapshotWriter(self.store.snapshot_dir(self.chat_id), self.identity())
        try:
            synced = self.writer.sync(self.session.cache, self.session.tokens, self.clean_upto)
            self.clean_upto = self.session.cache.seqlen
            if synced.written:
                self.store.prune_snapshots(keep=self.chat_id, budget_bytes=self.store.snapshot_budget)
        except (OSError, RuntimeError, ValueError, SafetensorError) as e:
            self.writer.segments = None  # rescan next time: what is on disk is uncertain now
            yield from self.report(f"KV snapshot not written: {describe(e)}; the chat is saved and will be "
                                   "re-prefilled when reopened")

    def detach(self) -> None:
        self.chat_id, self.title, self.writer, self.saved_sig = None, None, None, None
        self.clean_upto, self.created, self.expect, self.ephemeral = 0, 0.0, None, False
