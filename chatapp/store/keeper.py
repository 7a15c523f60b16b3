"""The chat keeper: the one chat object the faces talk to, with or without a store.

Faces call `keeper.send(text)` / `keeper.run_command(line)` and get the session's events, plus
`Saved`/`Restored` for /save and /load. Ordering is the point:
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

from chatapp.chat.commands import parse_chat_id, parse_command, run_handler
from chatapp.chat.edit import check_edit, rewind_and_send
from chatapp.chat.events import CacheState, Error, Event, Info, Restored, Saved, Trimmed, TurnStats
from chatapp.chat.presets import Presets, preset_command
from chatapp.chat.session import Session
from chatapp.store import rollback
from chatapp.store.branch import keep_branch
from chatapp.store.chat_model import drop, session_for
from chatapp.store.database import ChatChanged, ChatData, ChatStore, StoreError, describe
from chatapp.store.export import ExportedChat, export
from chatapp.store.identity import Fingerprint, ModelIdentity, tokenizer_fingerprint
from chatapp.store.reopen import restore, stored_messages
from chatapp.store.snapshots import SnapshotWriter, snapshot_bytes
from chatapp.store.switch import Loader, adopt, lm_device, one_line, release_memory, switch
from model.errors import UserError

SNAPSHOT_BUDGET = 4 << 30  # snapshots of older chats are pruned past this; those chats re-prefill


def reports_change(ev: Event) -> bool:
    """Events after which the chat on disk must already match memory. A retry's rewind is the
    start of a turn, not a change of its own: the store keeps the old reply until the new one."""
    match ev:
        case TurnStats() | Trimmed() | Info():  # Info: /set's change (a no-op commit for the rest)
            return True
        case CacheState(event=step):
            return step != "retry"
    return False


def default_title(session: Session) -> str:
    first = " ".join(session.exchanges[0].user.split()) if session.exchanges else "new chat"
    return first if len(first) <= 48 else first[:47] + "…"


class ChatKeeper:
    def __init__(self, session: Session, store: ChatStore | None, why_no_store: str = "--no-store"):
        self.session, self.store = session, store
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
        self.loader: Loader | None = None  # /model's: launch loads with the flags' device and dtype
        self.presets = Presets()  # launch gives it the config's and the saved ones

    # --- what faces call ----------------------------------------------------------
    def send(self, text: str) -> Iterator[Event]:
        yield from self._track(self.session.send(text))

    def run_command(self, line: str) -> Iterator[Event]:
        """A /command, dispatched through chatapp/chat/commands.py's table: the keeper's own
        (store=True) here, the rest by the session, with the chat committed as they report."""
        try:
            cmd = parse_command(line)
        except UserError as e:
            yield Error(str(e))
            return
        if cmd.spec.store:
            yield from run_handler(getattr(self, cmd.spec.handler), cmd.arg)
        else:
            yield from self._track(run_handler(getattr(self.session, cmd.spec.handler), cmd.arg))
            yield from self.write_snapshot()

    def cancel(self) -> None:
        self.session.cancel()

    def ready_fields(self) -> dict:
        r = self.restored
        return {"store": str(self.store.path) if self.store else None, "chat": self.chat_id,
                "title": self.title, "restored_tokens": r.restored_tokens if r else 0,
                "reprefilled_tokens": r.reprefilled_tokens if r else 0, "restore_detail": r.detail if r else "",
                "read_only": bool(self.store and self.store.read_only)}

    # --- the turn's ordering ------------------------------------------------------
    def _track(self, events: Iterator[Event]) -> Iterator[Event]:
        """Hand on the session's events, committing the chat before any event that reports a
        change to it, and writing the snapshot after each turn."""
        s = self.session
        low = s.cache.pos  # a plain turn only appends: positions below this stay as they were
        for ev in events:
            match ev:
                case Trimmed():
                    low = 0  # everything kept moved to new positions
                case TurnStats() if s.exchanges:  # a /retry rewinds to before the reply, re-feeds one token
                    low = min(low, s.exchanges[-1].reply_start - 1)
                case CacheState(event="reset" | "system"):
                    self.detach()  # a new chat: the old one stays stored as it was
            self.clean_upto = min(self.clean_upto, low, s.cache.pos)
            errors = list(self.commit()) if reports_change(ev) else []
            yield ev
            yield from errors
            if isinstance(ev, TurnStats):
                yield from self.write_snapshot()
                low = s.cache.pos

    def autosave(self) -> Iterator[Event]:
        yield from self.commit()
        yield from self.write_snapshot()

    # --- SQLite -------------------------------------------------------------------
    def signature(self) -> tuple:
        s = self.session
        # cache.pos too: a greedy /retry can give back the same tokens with a different pending tail;
        # the archive too: a trim can leave the same tokens after dropping one more exchange
        return (len(s.tokens), hash(tuple(s.tokens)), s.cache.pos, len(s.trimmed),
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
            data = self.chat_data()
            new = self.chat_id is None
            try:
                self.chat_id, self.created = self.store.save(data, self.expect), data.created
            except ChatChanged as e:  # keep both: theirs as it is, ours as a new chat
                old, title = self.chat_id, self.title
                self.detach()
                if not self.session.turns:  # ours is empty: nothing of ours to keep
                    yield Info(f"{e}: it stays as that window left it", {"chat": old})
                    return
                new = True
                self.title = f"{title} (2)" if title else None
                data = self.chat_data()
                self.chat_id, self.created = self.store.save(data), data.created
                yield Info(f"{e}: this conversation continues as chat #{self.chat_id}",
                           {"forked_from": old, "chat": self.chat_id})
            self.expect = [(m.role, m.content) for m in data.messages]
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

    def chat_data(self) -> ChatData:
        s = self.session
        ident = self.identity()
        msgs = stored_messages(s)
        self.title = self.title or default_title(s)
        return ChatData(self.title, s.lm.name, ident.digest, self.tokenizer_fp(),
                        dataclasses.asdict(s.settings), s.system, s.tokens[:s.prefix_len], s.cache.pos,
                        msgs, self.chat_id, self.created)

    def identity(self) -> ModelIdentity:
        assert self.fingerprint is not None
        return self.fingerprint.get()

    def tokenizer_fp(self) -> str:
        if self._tokenizer_fp is None:
            self._tokenizer_fp = tokenizer_fingerprint(self.session.tok)
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
            self.clean_upto = self.session.cache.pos
            if synced.written:
                self.store.prune_snapshots(keep=self.chat_id, budget_bytes=SNAPSHOT_BUDGET)
        except (OSError, RuntimeError, ValueError, SafetensorError) as e:
            self.writer.segments = None  # rescan next time: what is on disk is uncertain now
            yield from self.report(f"KV snapshot not written: {describe(e)}; the chat is saved and will be "
                                   "re-prefilled when reopened")

    # --- commands -----------------------------------------------------------------
    def save(self, title: str) -> Iterator[Event]:
        if self.store is None:
            yield Error(f"/save: chats are not stored in this session ({self.why_no_store})")
            return
        if self.store.read_only:
            yield Error(f"/save: {self.read_only_notice().text}")
            return
        if title:
            self.title = " ".join(title.split())
        self.last_error = ""
        events = list(self.commit(force=True))
        yield from events
        if any(isinstance(e, Error) for e in events):
            return
        snap_errors = list(self.write_snapshot())
        segs = self.writer.segments if self.writer else None
        size = snapshot_bytes(self.writer.folder) if self.writer else 0
        yield Saved(self.chat_id, self.title or "", 2 * len(self.session.exchanges), segs[-1].end if segs else 0,
                    size)
        yield from snap_errors

    def load(self, arg: str) -> Iterator[Event]:
        if self.store is None:
            yield Error(f"/load: chats are not stored in this session ({self.why_no_store})")
            return
        try:
            chat_id = parse_chat_id(arg) if arg else self.store.latest_id(exclude=self.chat_id)
        except ValueError:
            yield Error(f"/load: a chat id is a number, got {arg!r}")
            return
        except StoreError as e:
            yield Error(f"/load: {e}")
            return
        if chat_id is None:
            yield Error("/load: no other stored chat")
            return
        self.last_error = ""
        events = self.leave()
        if errors := [e for e in events if isinstance(e, Error)]:  # never drop a conversation the store lacks
            yield Error(f"/load: staying in this chat, it could not be saved ({errors[0].message}); "
                        "/export keeps a copy")
            return
        yield from events  # a fork to a new chat (another window changed this one) is worth saying
        try:
            restored, errors = self.open(chat_id)
        except StoreError as e:
            yield Error(f"/load: {e}")
            return
        yield restored
        yield from errors

    def leave(self) -> list[Event]:
        """Before /load opens another chat: this one committed (the events say how it went). A
        read-only store saves nothing, so leaving is never refused there: it says so again."""
        if self.store.read_only:
            return [self.read_only_notice()] if self.unsaved() else []
        return list(self.commit())

    def unsaved(self) -> bool:
        """The chat differs from what this window last stored (an empty new chat never counts)."""
        return bool(self.session.exchanges or self.chat_id is not None) and self.signature() != self.saved_sig

    def open(self, chat_id: int) -> tuple[Restored, list[Error]]:
        """Continue stored chat `chat_id` in this session. StoreError: not found, or cannot fit
        (the session is unchanged then). The chat is saved again at once: it becomes the latest
        (what --resume opens), takes this model's identity, and a re-prefilled cache gets its
        snapshot now rather than after the next turn."""
        assert self.store is not None
        chat = self.store.get(chat_id)
        if chat is None:
            raise StoreError(f"no stored chat {chat_id}")
        folder = self.store.snapshot_dir(chat_id)
        new, note = session_for(self, chat)  # the chat's own model (chatapp/store/chat_model.py)
        if new is None:
            self.restored = self._restore_here(chat_id, chat, folder)
        else:  # a session of its own: a failure leaves this one untouched
            try:
                restored = restore(new, chat, Fingerprint(new.lm).get(), folder)
            except Exception as e:
                drop(new)
                if isinstance(e, StoreError):
                    raise
                raise StoreError(f"chat {chat_id} could not be opened ({one_line(e)}); {self._where()}") from None
            old_device = lm_device(self.session.lm)
            adopt(self, new)
            del new
            release_memory(old_device)
            self.restored = restored
        if note:
            detail = "; ".join(filter(None, (note, self.restored.detail)))
            self.restored = dataclasses.replace(self.restored, detail=detail)
        self.detach()
        self.chat_id, self.title, self.created = chat_id, chat.title, chat.created
        # a damaged row's text may not read back as stored (bytes): nothing to compare a save with
        self.expect = None if chat.damage else [(m.role, m.content) for m in chat.messages]
        # past what the snapshot gave back, segments on disk are not trusted (one may be corrupt)
        self.clean_upto = self.restored.restored_tokens
        self.last_error = ""
        if self.store.read_only or chat.damage:
            # as stored: nothing to say until it changes (a damaged row is rewritten only by the user's next change)
            self.saved_sig = self.signature()
        return self.restored, [e for e in self.autosave() if isinstance(e, Error)]

    def _where(self) -> str:
        return f"still in chat #{self.chat_id}" if self.chat_id is not None else "this chat is unchanged"

    def _restore_here(self, chat_id: int, chat: ChatData, folder) -> Restored:
        """Restore `chat` into this session as a transaction (chatapp/store/rollback.py): on any
        failure after the adopt step the chat this window held is put back before the error."""
        checkpoint = rollback.take(self)
        try:
            return restore(self.session, chat, self.identity(), folder)
        except BaseException as e:
            rollback.put_back(self, checkpoint)
            if not isinstance(e, Exception):
                raise  # Ctrl+C: the chat is back as it was, and the interrupt goes on
            if isinstance(e, StoreError):
                raise
            raise StoreError(f"chat {chat_id} could not be opened ({one_line(e)}); {self._where()}") from None

    def follow_rename(self) -> None:
        """The chats screen renames straight in the store: take the open chat's title from there,
        or the next autosave would write the old one back."""
        if self.store is None or self.chat_id is None:
            return
        try:
            chat = self.store.get(self.chat_id)
        except StoreError:
            return  # the store's trouble shows at the next save
        if chat is not None:
            self.title = chat.title

    def detach(self) -> None:
        self.chat_id, self.title, self.writer, self.saved_sig = None, None, None, None
        self.clean_upto, self.created, self.expect, self.ephemeral = 0, 0.0, None, False

    def export(self, dest: str) -> Iterator[Event]:
        s = self.session
        t = ExportedChat(self.title or default_title(s), s.lm.name, s.system,
                       [(ex.user, *s.template.split_thinking(ex.reply)[::-1], ex.tool_calls)
                        for ex in s.trimmed + s.exchanges], self.chat_id,
                       self.created or None)
        try:
            path = export(t, dest)
        except StoreError as e:
            yield Error(str(e))
            return
        yield Info(f"exported {len(t.turns)} exchanges to {path}", {"path": str(path), "exchanges": len(t.turns)})

    def edit(self, arg: str) -> Iterator[Event]:
        """/edit N TEXT (chatapp/chat/edit.py). The chat as it is now is committed as a new chat
        first, the branch, and reported; then the chat rewinds to message N (committed before
        its `edit` event) and goes on with TEXT under its own id. Served here even without a
        store: the edit works, only the old continuation is not kept."""
        n, text, new = check_edit(self.session, arg)  # UserError: refused, nothing changed
        yield keep_branch(self, n, text)
        self.ephemeral = False  # the branch's title names this chat: an /undo to empty must not delete it
        yield from self._track(rewind_and_send(self.session, n, text, new))

    def attach_text(self, text: str) -> Iterator[Event]:
        """A paste too large for the input box: attached to the next message, as /file does."""
        yield from run_handler(self.session.attach_text, text)
    def preset(self, arg: str) -> Iterator[Event]:
        """`/preset ...` (chatapp/chat/presets.py); choosing one starts a new chat, as /system does."""
        yield from self._track(preset_command(self.presets, arg, self.session.system, self.session.set_system))

    def theme(self, _arg: str) -> Iterator[Event]:
        """The TUI serves /theme itself; here (headless) there is nothing to colour."""
        raise UserError("/theme: themes belong to the TUI; headless mode draws nothing")
        yield  # a generator, like every handler

    def switch_model(self, spec: str) -> Iterator[Event]:
        """`/model SPEC`: the same chat on another model (chatapp/store/switch.py)."""
        yield from switch(self, spec)
