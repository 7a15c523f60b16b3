"""The Textual face of the session: a transcript, an input box and a live KV-cache panel.

This file is the wiring only. All conversation logic lives in the session behind the keeper;
the parts of the face are objects of their own, each given the app as a `Face` (tui/face.py):
`Loading` opens the chat, `Turns` routes input to the keeper in the turn worker, `SessionView`
hands the events that come back (batched by `bridge.pump`) to the widgets that show them, and
`Actions` serves keys, screens and the palette. See docs/tui.md for the threading model.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, TextArea

from chatapp.tui.actions import Actions
from chatapp.tui.bridge import Loaded, LoadFailed, LoadProgress, SessionEvent, TextBatch, TurnFinished
from chatapp.tui.cache_panel import CachePanel, StatusLine
from chatapp.tui.clipboard import CodeTranscript
from chatapp.tui.editing import Editing
from chatapp.tui.face import EventSource
from chatapp.tui.input import ChatInput
from chatapp.tui.loading import WAITING, Loading, Opener
from chatapp.tui.model_screen import ModelPicker
from chatapp.tui.prefill_watch import PrefillWatch
from chatapp.tui.show import SessionView
from chatapp.tui.token_count import InputBorder
from chatapp.tui.transcript import Transcript
from chatapp.tui.turns import Turns
from chatapp.tui.visible import visible

if TYPE_CHECKING:  # the keeper imports torch, which must not delay the first frame
    from chatapp.keeper.keeper import ChatKeeper

SWITCH_INTERVAL_S = 0.001
PANEL_FOLD_WIDTH = 100  # below it the panel is a status line unless F2 shows it
PANEL_MIN_WIDTH = 80    # below it the panel cannot show


class ChatApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "nanochat-tui"
    # Below 100 columns the 38-column cache panel would take the chat's room (at 80, replies
    # wrapped at 33 columns): it folds to a status line, and F2 shows it again from 80 up. Below
    # 80 it stays folded (at 42 the input box had no columns left and Textual crashed drawing it).
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (PANEL_MIN_WIDTH, "-medium"), (PANEL_FOLD_WIDTH, "-wide")]
    BINDINGS = [
        Binding("escape", "stop", "Stop reply"),
        Binding("f1", "help", "Help"),
        Binding("f2", "panel", "Panel"),
        Binding("ctrl+o", "chats", "Chats"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("ctrl+y", "copy_reply", "Copy reply", priority=True),  # over the input box's redo
    ]

    def __init__(self, args: argparse.Namespace, stable: bool = False, opener: Opener | None = None) -> None:
        """`stable=True` hides figures that differ between runs (memory, timings): snapshots.
        `opener(args, progress)` makes the chat keeper (default: `chatapp.launch.open_chat`: a
        session, with the stored chat restored for --chat/--resume)."""
        super().__init__()
        # The turn's worker thread takes the GIL back after each C call; Python's default 5 ms
        # switch interval made it wait that long behind the UI's drawing, a token at a time.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.stable = stable
        self.keeper: ChatKeeper | None = None  # the one chat object: the session, stored as it goes
        self.border = InputBorder(self)
        self.editing = Editing(self)
        self.models = ModelPicker(self)
        self.loading = Loading(self, args, opener)
        self.turns = Turns(self, self.border, self.loading)
        self.actions = Actions(self, self.turns, self.editing)
        self.view = SessionView(self, self.turns, self.border, self.editing, self.models, self.actions.quit)

    def compose(self) -> ComposeResult:
        yield Header()
        status = StatusLine(id="status")
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield CodeTranscript(id="transcript")
                yield ChatInput(id="input", placeholder=WAITING)  # takes text at once (tui/loading.py)
                yield status
            yield CachePanel(self.stable, status, id="panel")
        yield Footer()

    async def on_mount(self) -> None:
        self.view.prefill_watch = PrefillWatch(self.transcript)
        self.input.cursor_blink = not self.stable  # a blinking cursor would make snapshots flaky
        self.input.focus()
        await self.loading.start()  # the config file's theme, then every change is kept in it
        self.theme_changed_signal.subscribe(self, self.actions.theme_chosen)

    # --- what the parts use (tui/face.py) ----------------------------------------------
    @property
    def session(self):
        """The keeper's session: /model replaces it."""
        return self.keeper.session if self.keeper is not None else None

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def panel(self) -> CachePanel:
        return self.query_one(CachePanel)

    @property
    def input(self) -> ChatInput:
        return self.query_one(ChatInput)

    @property
    def busy(self) -> bool:
        return self.turns.busy

    @property
    def inputs_done(self) -> int:
        return self.turns.inputs_done

    @property
    def batches(self) -> int:
        return self.view.batches

    async def submit(self, text: str) -> bool:
        return await self.turns.submit(text)

    def can_start(self) -> bool:
        return self.turns.can_start()

    def start_turn(self, events: EventSource, kind: str) -> None:
        self.turns.start(events, kind)

    def show_chat(self) -> None:
        """The header names the model and, once it is stored, the chat."""
        k = self.keeper
        chat = f" — chat #{k.chat_id} {k.title or ''}".rstrip() if k is not None and k.chat_id is not None else ""
        self.sub_title = visible(self.session.lm.name + chat)

    async def redraw(self) -> None:
        await self.view.redraw()

    # --- messages: from the workers, the input box ---------------------------------------
    def on_load_progress(self, msg: LoadProgress) -> None:
        self.loading.progress(msg)

    async def on_load_failed(self, msg: LoadFailed) -> None:
        await self.loading.failed_load(msg)

    async def on_loaded(self, msg: Loaded) -> None:
        await self.loading.loaded(msg)

    async def on_text_batch(self, msg: TextBatch) -> None:
        await self.view.text_batch(msg)

    async def on_session_event(self, msg: SessionEvent) -> None:
        await self.view.event(msg)

    def on_turn_finished(self, msg: TurnFinished) -> None:
        self.view.finished(msg)

    async def on_chat_input_submitted(self, msg: ChatInput.Submitted) -> None:
        await self.turns.submitted(msg)

    def on_chat_input_large_paste(self, msg: ChatInput.LargePaste) -> None:
        self.actions.large_paste(msg)

    def on_chat_input_edit_wanted(self, _msg: ChatInput.EditWanted) -> None:
        self.editing.edit_message()

    def on_chat_input_chosen(self, msg: ChatInput.Chosen) -> None:
        self.editing.chosen(msg)

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        self.border.changed(event)

    # --- actions: the bindings' and the command table's (`screen=`) names ----------------
    async def action_stop(self) -> None:
        await self.actions.stop()

    def action_panel(self) -> None:
        """F2, /panel: the cache panel hidden (its status line instead) or shown, whatever the width says."""
        main, shown = self.query_one("#main"), self.panel.display
        if not shown and self.size.width < PANEL_MIN_WIDTH:
            self.notify(f"The panel needs {PANEL_MIN_WIDTH} columns; this terminal has {self.size.width}.",
                        severity="warning")
            return
        main.set_class(shown, "-panel-off")
        main.set_class(not shown, "-panel-on")

    def action_quit(self) -> None:
        self.actions.quit()

    def action_help(self) -> None:
        self.actions.help()

    def action_chats(self) -> None:
        self.actions.chats()

    def action_models(self) -> None:
        self.models.open()

    def action_themes(self, name: str = "") -> None:
        self.actions.themes(name)

    def action_raw(self, arg: str = "") -> None:
        self.actions.raw(arg)

    async def action_copy_reply(self) -> None:
        await self.actions.copy_reply()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from self.actions.palette(self.action_chats, self.action_models)
