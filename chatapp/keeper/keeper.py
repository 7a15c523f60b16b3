"""The chat keeper: the one chat object the faces talk to, with or without a store, and the
commands it serves itself (the table's `store=True` ones): /save, /load, /export, /edit,
/preset, /model, plus opening a chat at launch. What it commits and when is its saving half
(chatapp/keeper/saving.py); dispatching commands, the base (chatapp/keeper/base.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from chatapp.chat.commands import parse_chat_id
from chatapp.chat.edit import check_edit, rewind_and_send
from chatapp.chat.events import Branched, Error, Event, Info, ModelSwitched, Restored, Saved
from chatapp.chat.figures import counted
from chatapp.chat.presets import Presets, preset_command
from chatapp.chat.session import Session
from chatapp.keeper import rollback
from chatapp.keeper.branch import keep_branch
from chatapp.keeper.chat_model import drop, session_for
from chatapp.keeper.models import listing, remember
from chatapp.keeper.reopen import restore
from chatapp.keeper.saving import SavingKeeper, default_title
from chatapp.keeper.switch import Loader, lm_device, one_line, release_memory, same_options, switch
from chatapp.store.database import ChatStore
from chatapp.store.export import ExportedChat, export
from chatapp.store.identity import Fingerprint
from chatapp.store.records import ChatRecord, StoreError
from chatapp.store.snapshots import snapshot_bytes
from model.errors import UserError

# the keeper's fields that say which stored chat this window holds and how far it was saved: what
# a failed open puts back (chatapp/keeper/rollback.py puts back the session's side)
STORED_CHAT_FIELDS = ("chat_id", "title", "created", "expect", "writer", "clean_upto", "saved_sig", "restored",
                      "ephemeral", "last_error", "said_read_only")


class ChatKeeper(SavingKeeper):
    def __init__(self, session: Session, store: ChatStore | None, why_no_store: str = "--no-store"):
        super().__init__(session, store, why_no_store)
        self.loader: Loader | None = None  # /model's: launch loads with the flags' device and dtype
        self.presets = Presets()  # launch gives it the config's and the saved ones

    def ready_fields(self) -> dict:
        r = self.restored
        return {"store": str(self.store.path) if self.store else None, "chat": self.chat_id,
                "title": self.title, "restored_tokens": r.restored_tokens if r else 0,
                "reprefilled_tokens": r.reprefilled_tokens if r else 0, "restore_detail": r.detail if r else "",
                "read_only": bool(self.store and self.store.read_only)}

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

    def open(self, chat_id: int) -> tuple[Restored, list[Error]]:
        """Continue stored chat `chat_id` in this session. StoreError: not found, or cannot fit
        (the session is unchanged then). The chat is saved again at once: it becomes the latest
        (what --resume opens), takes this model's identity, and a re-prefilled cache gets its
        snapshot now rather than after the next turn."""
        assert self.store is not None
        record = self.store.get(chat_id)
        if record is None:
            raise StoreError(f"no stored chat {chat_id}")
        folder = self.store.snapshot_dir(chat_id)
        # the chat's own model (chatapp/keeper/chat_model.py), or None: this session serves
        new, note = session_for(self.session, record, self.model_loader())
        restored = self._restore_into(new or self.session, chat_id, record, folder)
        if new is not None:
            self.adopt(new)
        self.restored = restored
        if note:
            detail = "; ".join(filter(None, (note, self.restored.detail)))
            self.restored = dataclasses.replace(self.restored, detail=detail)
        self.detach()
        self.chat_id, self.title, self.created = chat_id, record.title, record.created
        # a damaged row's text may not read back as stored (bytes): nothing to compare a save with
        self.expect = None if record.damage else [(m.role, m.content) for m in record.messages]
        # past what the snapshot gave back, segments on disk are not trusted (one may be corrupt)
        self.clean_upto = self.restored.restored_tokens
        self.last_error = ""
        if self.store.read_only or record.damage:
            # as stored: nothing to say until it changes (a damaged row is rewritten only by the user's next change)
            self.saved_sig = self.signature()
        return self.restored, [e for e in self.autosave() if isinstance(e, Error)]

    def _where(self) -> str:
        return f"still in chat #{self.chat_id}" if self.chat_id is not None else "this chat is unchanged"

    def _restore_into(self, session: Session, chat_id: int, record: ChatRecord, folder) -> Restored:
        """Restore `record` into `session` as a transaction. This keeper's own session is restored
        in place, so a failure puts the chat it held back (chatapp/keeper/rollback.py); another
        session (the chat's own model) is only adopted on success, so a failure just drops it.
        The two differ because in place keeps the loaded model, its cache and CUDA graphs."""
        here = session is self.session
        checkpoint = (rollback.take(session), {f: getattr(self, f) for f in STORED_CHAT_FIELDS}) if here else None
        try:
            return restore(session, record, self.identity() if here else Fingerprint(session.lm).get(), folder)
        except BaseException as e:
            if checkpoint is None:
                drop(session)
            else:
                self._put_back(*checkpoint)
            if not isinstance(e, Exception):
                raise  # Ctrl+C: the chat is back as it was, and the interrupt goes on
            if isinstance(e, StoreError):
                raise
            raise StoreError(f"chat {chat_id} could not be opened ({one_line(e)}); {self._where()}") from None

    def _put_back(self, session_state: rollback.Checkpoint, fields: dict) -> None:
        for name, value in fields.items():
            setattr(self, name, value)
        folder = self.store.snapshot_dir(self.chat_id) if self.store is not None and self.chat_id is not None else None
        n = rollback.put_back(self.session, session_state, self.identity, folder)
        self.clean_upto = min(self.clean_upto, n)  # positions past n will be recomputed: not the snapshot's

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
        n = len(t.turns)
        yield Info(f"exported {counted(n, 'exchange')} to {path}", {"path": str(path), "exchanges": n})

    def edit(self, arg: str) -> Iterator[Event]:
        """/edit N TEXT (chatapp/chat/edit.py). The chat as it is now is committed as a new chat
        first, the branch, and reported; then the chat rewinds to message N (committed before
        its `edit` event) and goes on with TEXT under its own id. Served here even without a
        store: the edit works, only the old continuation is not kept."""
        n, text, new = check_edit(self.session, arg)  # UserError: refused, nothing changed
        if self.store is None or self.store.read_only:  # nowhere to keep the old continuation
            yield Branched(self.chat_id, None, "", n, text, 0)
        else:
            yield keep_branch(self.store, self.record(), self.clean_upto, n, text)
        self.ephemeral = False  # the branch's title names this chat: an /undo to empty must not delete it
        yield from self.track(rewind_and_send(self.session, n, text, new))


    def preset(self, arg: str) -> Iterator[Event]:
        """`/preset ...` (chatapp/chat/presets.py); choosing one starts a new chat, as /system does."""
        yield from self.track(preset_command(self.presets, arg, self.session.system, self.session.set_system))

    def theme(self, _arg: str) -> Iterator[Event]:
        """The TUI serves /theme itself; here (headless) there is nothing to colour."""
        raise UserError("/theme: themes belong to the TUI; headless mode draws nothing")
        yield  # a generator, like every handler

    def raw(self, _arg: str) -> Iterator[Event]:
        """The TUI serves /raw itself; headless mode's turn events already carry the raw reply."""
        raise UserError("/raw: the raw view is the TUI's; headless mode's turn events carry each reply as written")
        yield  # a generator, like every handler

    def panel(self, _arg: str) -> Iterator[Event]:
        """The TUI serves /panel itself; here (headless) there is no panel."""
        raise UserError("/panel: the cache panel belongs to the TUI; headless mode reports the figures "
                        "in each turn's JSON and /stats")
        yield  # a generator, like every handler

    def switch_model(self, spec: str) -> Iterator[Event]:
        """`/model SPEC`: the same chat on another model (chatapp/keeper/switch.py); alone, the list."""
        if not spec:
            yield listing(self.session.lm.name, self.store.root if self.store else None)
            return
        done = yield from switch(self.session, spec, self.model_loader())
        self.adopt(done.session)
        if self.store is not None and not self.store.read_only:
            remember(self.store.root, done.named)
        yield from self.commit()
        s = self.session
        yield ModelSwitched(s.lm.name, done.previous, len(s.exchanges), done.trimmed, s.cache.seqlen, s.cache.seqlen,
                            s.cache.capacity, done.load_s, done.prefill_s, s.system)
        yield from self.write_snapshot()

    def model_loader(self) -> Loader:
        return self.loader or same_options(self.session.lm)

    def adopt(self, new: Session) -> None:
        """Continue on `new` (a /model switch's, or a reopened chat's own model): same chat id and
        title, the new model's identity. The saved signature is dropped so the next commit stores
        the new model's name, identity and tokens even when the token ids came out the same; the
        snapshot starts again from position 0. The old session's memory is given back."""
        device = lm_device(self.session.lm)
        self.session = new
        self.lend_budget()
        self.fingerprint = Fingerprint(new.lm) if self.store else None
        self._tokenizer_fp = None
        self.writer, self.saved_sig, self.clean_upto = None, None, 0
        self.restored = None  # its line described the old model's cache
        release_memory(device)  # nothing refers to the old session now
