"""What every keeper shares (the in-process `ChatKeeper` and `--backend`'s `RemoteKeeper`): the
one command dispatcher, and the chats screen's list, rename and delete (the screen writes to the
store only through its keeper, from a worker thread).

A face parses a typed line once (`chatapp/chat/commands.py`'s `parse_command`) and hands the
`Command` to `keeper.run`. The table says who serves it: a `store` command is the keeper's own
method, any other the session's, whose events go through the keeper's `track` so that the chat
is committed before an event reporting a change leaves. A keeper without the handler (a
`--backend` chat has no `/preset`) refuses in one line.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from chatapp.chat.commands import Command, parse_command, run_handler
from chatapp.chat.events import Error, Event
from chatapp.store.database import ChatStore
from chatapp.store.records import ChatSummary
from model.errors import UserError


class Keeper(ABC):
    session: Any              # a Session, or a RemoteSession: the handlers the table names
    store: ChatStore | None
    chat_id: int | None       # the stored chat this window holds (None: not stored yet)
    title: str | None
    saved_sig: tuple | None   # `signature()` as last committed
    why_no_store: str
    last_error: str           # the last save's failure, "" once a save went through
    unserved = "not available in this session"  # a command whose handler this keeper lacks

    @abstractmethod
    def track(self, events: Iterator[Event]) -> Iterator[Event]:
        """Hand on a session handler's events, committing the chat as they report changes."""

    @abstractmethod
    def signature(self) -> tuple:
        """What the store must match for this chat to count as saved."""

    @abstractmethod
    def autosave(self) -> Iterator[Event]:
        """Commit the chat if it changed (the faces' exit: chatapp/keeper/final_save.py)."""

    @abstractmethod
    def export(self, dest: str) -> Iterator[Event]:
        """`/export [PATH]`: the chat as Markdown."""

    @abstractmethod
    def ready_fields(self) -> dict:
        """Headless mode's `ready` line: the store and the chat this window opened with."""

    def after_command(self) -> Iterator[Event]:
        """After a session command's events: ChatKeeper brings its KV snapshot up to date."""
        return iter(())

    # --- commands: the one dispatcher ---------------------------------------------------
    def run(self, cmd: Command) -> Iterator[Event]:
        owner = self if cmd.spec.store else self.session
        handler = getattr(owner, cmd.spec.handler, None)
        if handler is None:
            yield Error(f"{cmd.name}: {self.unserved}")
            return
        if cmd.spec.store:
            yield from run_handler(handler, cmd.arg)
            return
        yield from self.track(run_handler(handler, cmd.arg))
        yield from self.after_command()

    def run_command(self, line: str) -> Iterator[Event]:
        """A typed line, for scripts and tests: parsed once here, then `run`. Faces parse it
        themselves (they serve some commands with a screen) and call `run`."""
        try:
            cmd = parse_command(line)
        except UserError as e:
            yield Error(str(e))
            return
        yield from self.run(cmd)

    def send(self, text: str) -> Iterator[Event]:
        yield from self.track(self.session.send(text))

    def cancel(self) -> None:
        self.session.cancel()

    def attach_text(self, text: str) -> Iterator[Event]:
        """A paste too large for the input box: attached to the next message, as /file does."""
        yield from run_handler(self.session.attach_text, text)

    # --- the chats screen (chatapp/tui/chats_screen.py) -----------------------------------
    def chats(self, query: str = "") -> tuple[list[ChatSummary], set[int] | None]:
        """The stored chats, newest first, and the ids of those holding `query` (None: no search)."""
        store = self.listed_store()
        return store.list(), (store.search(query) if query else None)

    def rename_chat(self, chat_id: int, title: str) -> None:
        """StoreError: not renamed. The open chat takes its new title at once, so the next save
        keeps it rather than writing the old one back, and a chat that was saved stays saved."""
        saved = self.chat_id == chat_id and not self.unsaved()
        title = self.listed_store().rename(chat_id, title)
        if chat_id == self.chat_id:
            self.title = title
            if saved:
                self.saved_sig = self.signature()

    def delete_chat(self, chat_id: int) -> None:
        """StoreError: not deleted. The chat open here is refused: this window would store it again."""
        if chat_id == self.chat_id:
            raise UserError(f"chat #{chat_id} is open here: open another or start a new chat before deleting it")
        self.listed_store().delete(chat_id)

    def listed_store(self) -> ChatStore:
        if self.store is None:
            raise UserError(f"chats are not stored in this session ({self.why_no_store})")
        return self.store

    def unsaved(self) -> bool:
        """The chat differs from what this window last stored (an empty new chat never counts)."""
        return bool(self.session.exchanges or self.chat_id is not None) and self.signature() != self.saved_sig
