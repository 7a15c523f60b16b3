"""The chat keeper of a `--backend` chat: what the faces talk to, as with the in-process
`ChatKeeper`. Chats go to the same store, as text: the server's token ids and cache are not
ours to keep, so a stored remote chat has no KV snapshot and no token ids (a local model that
opens one later sees its messages as text only). /load opens any stored chat by its text, a
local one included, and the server then prefills it on the next message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from chatapp.chat.attach import chat_title
from chatapp.chat.commands import parse_chat_id
from chatapp.chat.events import CacheState, Error, Event, Info, Restored, Saved, TurnStats
from chatapp.chat.figures import counted
from chatapp.chat.settings import Settings
from chatapp.keeper.base import Keeper
from chatapp.remote.session import RemoteExchange, RemoteSession
from chatapp.store.database import ChatStore
from chatapp.store.export import ExportedChat, export
from chatapp.store.records import ChatChanged, ChatRecord, StoredMessage, StoreError
from model.errors import UserError

NO_SERVER_SIDE = "the server decides the model: start another server, or leave out --backend"
FINGERPRINT = "remote"  # stands where a local chat has its model's fingerprint: no snapshot can match it


class RemoteKeeper(Keeper):
    unserved = "not with --backend"

    def __init__(self, session: RemoteSession, store: ChatStore | None, why_no_store: str = "--no-store"):
        self.session, self.store, self.why_no_store = session, store, why_no_store
        self.chat_id: int | None = None
        self.title: str | None = None
        self.created = 0.0
        self.restored: Restored | None = None
        self.loader = None
        self.saved_sig: tuple | None = None   # what the store holds of this chat (final_save asks)
        self.last_error = ""

    def edit(self, arg: str) -> Iterator[Event]:
        """/edit N TEXT: the session rewinds and goes on (no branch is kept: the chat is text only)."""
        yield from self.track(self.session.edit(arg))

    def switch_model(self, _spec: str) -> Iterator[Event]:
        raise UserError(f"/model: not with --backend: {NO_SERVER_SIDE}")
        yield  # a generator, like every handler

    def ready_fields(self) -> dict:
        return {"store": str(self.store.path) if self.store else None, "chat": self.chat_id, "title": self.title,
                "backend": self.session.client.base, "server_model": self.session.model}

    # --- the store -----------------------------------------------------------------
    def track(self, events: Iterator[Event]) -> Iterator[Event]:
        """Commit after a turn or a change, before handing its event on (as ChatKeeper does)."""
        for ev in events:
            if isinstance(ev, CacheState) and ev.event in ("reset", "system"):
                self.chat_id, self.title, self.created = None, None, 0.0  # a new chat; the old one stays stored
            errors = list(self.commit()) if isinstance(ev, TurnStats | CacheState | Info) else []
            yield ev
            yield from errors

    def record(self) -> ChatRecord:
        s = self.session
        msgs = [m for ex in s.exchanges for m in (StoredMessage("user", ex.user, []),
                                                  StoredMessage("assistant", ex.reply, []))]
        self.title = self.title or chat_title(s.exchanges[0].user if s.exchanges else None)
        return ChatRecord(self.title, s.lm.name, FINGERPRINT, FINGERPRINT, dataclasses.asdict(s.settings), s.system,
                        [], 0, msgs, self.chat_id, self.created)

    def signature(self) -> tuple:
        return self.title, [(ex.user, ex.reply) for ex in self.session.exchanges]

    def autosave(self) -> Iterator[Event]:
        yield from self.commit()

    def commit(self, force: bool = False) -> Iterator[Event]:
        if self.store is None or self.store.read_only or not (force or self.session.exchanges or self.chat_id):
            return
        record = self.record()
        sig = self.signature()
        try:
            try:
                self.chat_id = self.store.save(record)
            except ChatChanged:  # another window changed it: ours goes on as a new chat
                self.chat_id = None
                self.chat_id = self.store.save(dataclasses.replace(record, id=None))
            self.created = self.created or record.created
            self.saved_sig, self.last_error = sig, ""
        except StoreError as e:
            self.last_error = str(e)
            yield Error(f"chat not saved: {e}; it stays open and the next save will catch up")

    def save(self, title: str) -> Iterator[Event]:
        if self.store is None:
            raise UserError(f"/save: chats are not stored in this session ({self.why_no_store})")
        if title:
            self.title = " ".join(title.split())
        errors = list(self.commit(force=True))
        if errors:
            yield from errors
            return
        yield Saved(self.chat_id, self.title or "", 2 * len(self.session.exchanges), 0, 0)

    def load(self, arg: str) -> Iterator[Event]:
        if self.store is None:
            raise UserError(f"/load: chats are not stored in this session ({self.why_no_store})")
        try:
            chat_id = parse_chat_id(arg) if arg else self.store.latest_id(exclude=self.chat_id)
            record = self.store.get(chat_id) if chat_id is not None else None
        except ValueError:
            raise UserError(f"/load: a chat id is a number, got {arg!r}") from None
        except StoreError as e:
            raise UserError(f"/load: {e}") from None
        if record is None:
            raise UserError("/load: no other stored chat" if not arg else f"/load: no stored chat {arg}")
        yield from self.commit()
        s = self.session
        users, replies = record.messages[0::2], record.messages[1::2]
        s.exchanges = [RemoteExchange(u.content, a.content) for u, a in zip(users, replies, strict=False)]
        s.turn_stats, s.last = [], None
        s.settings = Settings(**{**dataclasses.asdict(Settings()), **record.settings, "system": record.system or None})
        self.chat_id, self.title, self.created = record.id, record.title, record.created
        self.restored = Restored(record.id, record.title, 0, 0, 0, len(record.messages), 0, s.context,
                                 "the server prefills it with the next message")
        yield self.restored

    def export(self, dest: str) -> Iterator[Event]:
        s = self.session
        t = ExportedChat(self.title or "chat", s.lm.name, s.system,
                         [(ex.user, ex.reply, "", ex.tool_calls) for ex in s.exchanges], self.chat_id,
                         self.created or None)
        try:
            path = export(t, dest)
        except StoreError as e:
            raise UserError(str(e)) from None
        n = len(t.turns)
        yield Info(f"exported {counted(n, 'exchange')} to {path}", {"path": str(path), "exchanges": n})
