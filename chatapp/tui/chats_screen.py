"""The chats screen: the stored chats, newest first; open, rename, delete, or start a new one.

It manages the list through the app's keeper (chatapp/keeper/base.py): the list is read from it,
and rename and delete are the keeper's, run in a worker thread (a store locked by another program
waits there, not in the screen), so the open chat's title follows a rename at once. It hands back
only what the app must act on, through `dismiss`: `ChatAction("open", id)`, `ChatAction("new")`,
or None when closed with Esc. The chat open in the app cannot be deleted from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Label

from chatapp.keeper.base import Keeper
from chatapp.tui.visible import visible
from model.errors import UserError


@dataclass(frozen=True)
class ChatAction:
    kind: str                 # "open" | "new"
    chat_id: int | None = None


def when(ts: float) -> str:
    """Today's chats by time, older ones by date."""
    fmt = "%H:%M" if time.localtime(ts)[:3] == time.localtime()[:3] else "%Y-%m-%d"
    return time.strftime(fmt, time.localtime(ts))


class ChatsScreen(Screen[ChatAction | None]):
    BINDINGS = [
        Binding("enter", "open", "Open"),  # the table takes Enter first and says RowSelected
        Binding("n", "new", "New chat"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
        Binding("slash", "search", "Search"),
        Binding("escape", "close", "Back", priority=True),
    ]
    DEFAULT_CSS = """
    ChatsScreen #chats-box { padding: 1 2; }
    ChatsScreen #chats-title { text-style: bold; margin-bottom: 1; }
    ChatsScreen DataTable { height: 1fr; }
    ChatsScreen #search { margin-bottom: 1; }
    ChatsScreen #rename { display: none; }
    ChatsScreen #rename.editing { display: block; }
    ChatsScreen .hint { color: $text-muted; margin-top: 1; }
    """

    def __init__(self, keeper: Keeper) -> None:
        super().__init__()
        self.keeper = keeper
        self.confirm_delete: int | None = None  # a first `d` arms, a second on the same chat deletes

    def compose(self) -> ComposeResult:
        with Vertical(id="chats-box"):
            yield Label("Chats", id="chats-title")
            yield Input(id="search", placeholder="Search titles and messages (/ here, Enter to the list)")
            yield DataTable(cursor_type="row", zebra_stripes=True, id="chats")
            yield Input(id="rename", placeholder="New title (Enter saves, Esc cancels)")
            yield Label("Enter opens · n new chat · r rename · d delete · Esc back", id="chats-hint", classes="hint")
        yield Footer()

    def on_mount(self) -> None:
        # exchanges: a user message with its reply, numbered as /edit N and the transcript number them
        self.table.add_columns("id", "title", "model", "exchanges", "updated")
        self.reload()
        self.table.focus()  # typing goes to the list's keys; / searches

    @property
    def table(self) -> DataTable:
        return self.query_one(DataTable)

    @property
    def rename_box(self) -> Input:
        return self.query_one("#rename", Input)

    @property
    def search_box(self) -> Input:
        return self.query_one("#search", Input)

    def reload(self, select: int | None = None) -> None:
        query = self.search_box.value.strip()
        try:
            chats, found = self.keeper.chats(query)
        except UserError as e:  # StoreError: a locked or damaged store
            self.notify(str(e), severity="error")
            chats, found = [], None
        total = len(chats)
        if found is not None:
            chats = [c for c in chats if c.id in found]
        self.table.clear()
        for c in chats:
            mark = (" (open)" if c.id == self.keeper.chat_id else "") + (" (damaged)" if c.damaged else "")
            # Text, not str: a DataTable parses str cells as markup, and a title like "[/INST]" would crash it.
            self.table.add_row(str(c.id), Text(visible(c.title) + mark), Text(visible(c.model)), str(c.messages),
                               when(c.updated), key=str(c.id))
        if select is not None and str(select) in {str(c.id) for c in chats}:
            self.table.move_cursor(row=self.table.get_row_index(str(select)))
        hint = ("No stored chats yet: n starts one, Esc goes back." if not total else
                "Enter opens · n new chat · r rename · d delete · / search · Esc back")
        if found is not None:
            hint = f"{len(chats)} of {total} chats hold {query!r} · Esc clears the search · " + hint
        self.query_one("#chats-hint", Label).update(Text(visible(hint)))

    def selected(self) -> int | None:
        if self.table.row_count == 0:
            return None
        key = self.table.coordinate_to_cell_key(self.table.cursor_coordinate).row_key
        return int(key.value)

    # --- actions -------------------------------------------------------------------
    def action_open(self) -> None:
        if (chat_id := self.selected()) is not None:
            self.dismiss(ChatAction("open", chat_id))

    def on_data_table_row_selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_new(self) -> None:
        self.dismiss(ChatAction("new"))

    def action_close(self) -> None:
        if self.rename_box.has_class("editing"):
            self.end_rename()
        elif self.search_box.value:
            self.search_box.value = ""  # its Changed reloads the whole list
            self.table.focus()
        else:
            self.dismiss(None)

    def action_search(self) -> None:
        self.search_box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "search":
            self.reload()

    def action_rename(self) -> None:
        if (chat_id := self.selected()) is None:
            return
        box = self.rename_box
        box.value = str(self.table.get_row(str(chat_id))[1]).removesuffix(" (open)")
        box.add_class("editing")
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "search":
            self.table.focus()
            return
        chat_id = self.selected()
        if chat_id is None:
            self.end_rename()
            return
        self.write(partial(self.keeper.rename_chat, chat_id, event.value), partial(self.renamed, chat_id))

    def renamed(self, chat_id: int) -> None:
        self.end_rename()
        self.reload(select=chat_id)

    def end_rename(self) -> None:
        self.rename_box.remove_class("editing")
        self.table.focus()

    def action_delete(self) -> None:
        chat_id = self.selected()
        if chat_id is None:
            return
        if chat_id == self.keeper.chat_id:
            self.notify("This chat is open: start a new chat (n) or open another before deleting it.",
                        severity="warning")
            return
        if self.confirm_delete != chat_id:
            self.confirm_delete = chat_id
            self.notify(f"Press d again to delete chat {chat_id}.", severity="warning")
            return
        self.confirm_delete = None
        self.write(partial(self.keeper.delete_chat, chat_id), self.reload, always=True)

    @work(thread=True, group="chats-store", exit_on_error=False)
    def write(self, change: Callable[[], None], done: Callable[[], None], always: bool = False) -> None:
        """A rename or delete by the keeper, off the UI thread; `done` then runs on it (after a
        refusal too if `always`), and a refusal is one line."""
        try:
            change()
        except UserError as e:  # StoreError: locked, no such chat; the open chat refused
            self.app.call_from_thread(self.notify, str(e), severity="error")
            if not always:
                return
        self.app.call_from_thread(done)

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self.confirm_delete = None  # moving away disarms a pending delete
