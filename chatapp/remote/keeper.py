"""The chat keeper of a `--backend` chat: what the faces talk to, as with the in-process
`ChatKeeper`. Chats go to the same store, as text: the server's token ids and cache are not
ours to keep, so a stored remote chat has no KV snapshot and no token ids (a local model that
opens one later sees its messages as text only). /load opens any stored chat by its text, a
local one included, and the server then prefills it on the next message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from chatapp.chat.commands import parse_chat_id, parse_command, run_handler
from chatapp.chat.events import CacheState, Error, Event, Info, Restored, Saved, TurnStats
from chatapp.chat.settings import Settings
from chatapp.remote.session import RemoteExchange, RemoteSession
from chatapp.store.database import ChatChanged, ChatData, ChatStore, StoredMessage, StoreError
from chatapp.store.export import ExportedChat, export
from model.errors import UserError

FINGERPRINT = "remote"  # stands where a local chat has its model's fingerprint: no snapshot can match it


class RemoteKeeper:
    def __init__(self, session: RemoteSession, store: ChatStore | None, why_no_store: str = "--no-store"):
        self.session, self.store, self.why_no_store = session, store, why_no_store
        self.chat_id: int | None = None
        self.title: str | None = None
        self.created = 0.0
        self.restored: Restored | None = None
        self.loader = None
        self.saved_sig: tuple | None = None   # what the store holds of this chat (final_save asks)
        self.last_error = ""

    def send(self, text: str) -> Iterator[Event]:
        yield from self._track(self.session.send(text))

    def run_command(self, line: str) -> Iterator[Event]:
        try:
            cmd = parse_command(line)
        except UserError as e:
            yield Error(str(e))
            return
        if cmd.name in ("/save", "/load", "/export"):
            yield from run_handler(getattr(self, cmd.spec.handler), cmd.arg)
        elif cmd.name == "/edit":
            yield from self._track(run_handler(self.session.edit, cmd.arg))
        else:
            yield from self._track(self.session.run_command(line))

    def cancel(self) -> None:
        self.session.cancel()

    def attach_text(self, text: str) -> Iterator[Event]:
        yield from run_handler(self.session.attach_text, text)

    def follow_rename(self) -> None:
        if self.store is not None and self.chat_id is not None:
            try:
                chat = self.store.get(self.chat_id)
            except StoreError:
                return
            self.title = chat.title if chat else self.title

    def ready_fields(self) -> dict:
        return {"store": str(self.store.path) if self.store else None, "chat": self.chat_id, "title": self.title,
                "backend": self.session.client.base, "server_model": self.session.model}

    # --- the store -----------------------------------------------------------------
    def _track(self, events: Iterator[Event]) -> Iterator[Event]:
        """Commit after a turn or a change, before handing its event on (as ChatKeeper does)."""
        for ev in events:
            if isinstance(ev, CacheState) and ev.event in ("reset", "system"):
                self.chat_id, self.title, self.created = None, None, 0.0  # a new chat; the old one stays stored
            errors = list(self.commit()) if isinstance(ev, TurnStats | CacheState | Info) else []
            yield ev
            yield from errors

    def chat_data(self) -> ChatData:
        s = self.session
        msgs = [m for ex in s.exchanges for m in (StoredMessage("user", ex.user, []),
                                                  StoredMessage("assistant", ex.reply, []))]
        first = " ".join(s.exchanges[0].user.split()) if s.exchanges else "new chat"
        self.title = self.title or (first if len(first) <= 48 else first[:47] + "…")
        return ChatData(self.title, s.lm.name, FINGERPRINT, FINGERPRINT, dataclasses.asdict(s.settings), s.system,
                        [], 0, msgs, self.chat_id, self.created)

    def signature(self) -> tuple:
        return self.title, [(ex.user, ex.reply) for ex in self.session.exchanges]

    def unsaved(self) -> bool:
        """The chat differs from what this window last stored (an empty new chat never counts)."""
        return bool(self.session.exchanges or self.chat_id is not None) and self.signature() != self.saved_sig

    def autosave(self) -> Iterator[Event]:
        yield from self.commit()

    def commit(self, force: bool = False) -> Iterator[Event]:
        if self.store is None or self.store.read_only or not (force or self.session.exchanges or self.chat_id):
            return
        data = self.chat_data()
        sig = self.signature()
        try:
            try:
                self.chat_id = self.store.save(data)
            except ChatChanged:  # another window changed it: ours goes on as a new chat
                self.chat_id = None
                self.chat_id = self.store.save(dataclasses.replace(data, id=None))
            self.created = self.created or data.created
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
            chat = self.store.get(chat_id) if chat_id is not None else None
        except ValueError:
            raise UserError(f"/load: a chat id is a number, got {arg!r}") from None
        except StoreError as e:
            raise UserError(f"/load: {e}") from None
        if chat is None:
            raise UserError("/load: no other stored chat" if not arg else f"/load: no stored chat {arg}")
        yield from self.commit()
        s = self.session
        users, replies = chat.messages[0::2], chat.messages[1::2]
        s.exchanges = [RemoteExchange(u.content, a.content) for u, a in zip(users, replies, strict=False)]
        s.turn_stats, s.last = [], None
        s.settings = Settings(**{**dataclasses.asdict(Settings()), **chat.settings, "system": chat.system or None})
        self.chat_id, self.title, self.created = chat.id, chat.title, chat.created
        self.restored = Restored(chat.id, chat.title, 0, 0, 0, len(chat.messages), 0, s.context,
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
        yield Info(f"exported {len(t.turns)} exchanges to {path}", {"path": str(path), "exchanges": len(t.turns)})
