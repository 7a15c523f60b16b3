"""The chats screen: the stored chats, newest first; open, rename, delete, or start a new one.

It manages the list itself (rename and delete go straight to the store) and hands back only
what the app must act on, through `dismiss`: `ChatAction("open", id)`, `ChatAction("new")`, or
None when closed with Esc. The chat open in the app cannot be deleted from here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Label

from chatapp.store.database import ChatStore, StoreError
from chatapp.tui.visible import visible


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

    def __init__(self, store: ChatStore, current: int | None = None) -> None:
        super().__init__()
        self.store, self.current = store, current
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
        self.table.add_columns("id", "title", "model", "messages", "updated")
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
            chats = self.store.list()
            found = self.store.search(query) if query else None
        except StoreError as e:
            self.notify(str(e), severity="error")
            chats, found = [], None
        total = len(chats)
        if found is not None:
            chats = [c for c in chats if c.id in found]
        self.table.clear()
        for c in chats:
            mark = (" (open)" if c.id == self.current else "") + (" (damaged)" if c.damaged else "")
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
        if chat_id is not None:
            try:
                self.store.rename(chat_id, event.value)
            except StoreError as e:
                self.notify(str(e), severity="error")
                return
        self.end_rename()
        self.reload(select=chat_id)

    def end_rename(self) -> None:
        self.rename_box.remove_class("editing")
        self.table.focus()

    def action_delete(self) -> None:
        chat_id = self.selected()
        if chat_id is None:
            return
        if chat_id == self.current:
            self.notify("This chat is open: start a new chat (n) or open another before deleting it.",
                        severity="warning")
            return
        if self.confirm_delete != chat_id:
            self.confirm_delete = chat_id
            self.notify(f"Press d again to delete chat {chat_id}.", severity="warning")
            return
        self.confirm_delete = None
        try:
            self.store.delete(chat_id)
        except StoreError as e:
            self.notify(str(e), severity="error")
        self.reload()

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self.confirm_delete = None  # moving away disarms a pending delete
