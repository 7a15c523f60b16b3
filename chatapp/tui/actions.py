"""The app's actions: keys (Esc, F1, Ctrl+O, Ctrl+Q, Ctrl+Y), the screens some commands open
(/help, /chats, /theme, /quit), and the command palette's entries. `ChatApp`'s `action_*`
methods (which Textual's bindings and the command table name) hand on to these.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from textual.app import SystemCommand
from textual.theme import Theme

from chatapp.chat.commands import TABLE, Command, CommandSpec
from chatapp.tui.chats_screen import ChatAction, ChatsScreen
from chatapp.tui.editing import Editing
from chatapp.tui.face import Face
from chatapp.tui.input import ChatInput
from chatapp.tui.raw_view import raw_screen
from chatapp.tui.screens import HelpScreen
from chatapp.tui.theme_keeper import keep_theme
from chatapp.tui.turns import Turns
from model.errors import UserError


class Actions:
    def __init__(self, app: Face, turns: Turns, editing: Editing) -> None:
        self.app, self.turns, self.editing = app, turns, editing

    async def stop(self) -> None:
        """Esc: stop the reply; else take back a message waiting for the model; else leave an edit."""
        if not self.turns.stop() and not await self.turns.loading.take_back():
            self.editing.cancel_edit()

    def quit(self) -> None:
        """While the model writes: stop it and quit once the turn has ended, so the partial reply
        is committed to the store first. A second Ctrl+Q quits at once."""
        if self.turns.busy and not self.turns.quit_after and self.turns.stop():
            self.turns.quit_after = True
            return
        self.app.exit()

    def help(self) -> None:
        if not isinstance(self.app.screen, HelpScreen):
            self.app.push_screen(HelpScreen())

    def themes(self, name: str = "") -> None:
        """`/theme` alone: Textual's theme picker; `/theme NAME`: that theme, or a line listing them."""
        app = self.app
        if not name:
            app.action_change_theme()
        elif name == app.theme:  # no change, so no signal: keep it all the same
            app.notify(keep_theme(name)[0], markup=False)
        elif name in app.available_themes:
            app.theme = name  # theme_chosen keeps it
        else:
            app.notify(f"/theme: no theme {name!r}; themes: {', '.join(sorted(app.available_themes))}",
                       severity="error")

    def theme_chosen(self, theme: Theme) -> None:
        """Every change of theme (/theme NAME, the picker) is written to the config file; the
        file's own theme, applied at start, has nothing to write and says nothing."""
        line, kept = keep_theme(theme.name)
        if kept is not None:
            self.app.notify(line, severity="information" if kept else "warning", markup=False)

    def raw(self, arg: str = "") -> None:
        """`/raw [N]`: a reply's raw text in a screen of its own (chatapp/tui/raw_view.py)."""
        try:
            self.app.push_screen(raw_screen(self.app.transcript, arg))
        except UserError as e:
            self.app.notify(str(e), severity="error", markup=False)

    def chats(self) -> None:
        """The stored chats: open one (its cache comes back from its snapshot), or start a new one."""
        app = self.app
        if isinstance(app.screen, ChatsScreen) or not app.can_start():
            return
        if app.keeper.store is None:
            app.notify(f"Chats are not kept in this session ({app.keeper.why_no_store}).", severity="warning")
            return
        app.push_screen(ChatsScreen(app.keeper), self.chats_closed)

    async def chats_closed(self, action: ChatAction | None) -> None:
        app, keeper = self.app, self.app.keeper
        app.show_chat()
        if action is None or not app.can_start():  # a turn started behind the screen (the palette)
            return
        if action.kind == "open" and action.chat_id != keeper.chat_id:
            app.start_turn(partial(keeper.run, Command.of("/load", str(action.chat_id))), "command")
        elif action.kind == "new":
            app.start_turn(partial(keeper.run, Command.of("/reset")), "command")

    async def copy_reply(self) -> None:
        """Ctrl+Y: the last reply to the clipboard, through /copy (the session knows its text)."""
        if not isinstance(self.app.screen, (HelpScreen, ChatsScreen)):
            await self.app.submit("/copy")

    def large_paste(self, msg: ChatInput.LargePaste) -> None:
        """Too large to edit in the box without every key lagging: it goes with the next message."""
        if self.app.can_start():
            self.app.start_turn(partial(self.app.keeper.attach_text, msg.text), "command")

    def palette(self, chats, models) -> Iterator[SystemCommand]:
        """The palette's entries beside Textual's own: every command, the presets, two screens."""
        for spec in TABLE:
            help = spec.help_for(True) + (f" ({spec.key})" if spec.key else "")
            yield SystemCommand(spec.usage, help, partial(self.palette_command, spec))
        presets = self.app.keeper.presets.all() if self.app.keeper is not None else {}
        for name, text in sorted(presets.items()):
            yield SystemCommand(f"Preset: {name}", f"a new chat with this system prompt: {' '.join(text.split())[:80]}",
                                partial(self.app.submit, f"/preset {name}"))
        yield SystemCommand("Chats", "the stored chats: open, rename, delete, new (Ctrl+O)", chats)
        yield SystemCommand("Switch model…", "the default model, the pulled ones, recent ones: the chat carries over",
                            models)

    async def palette_command(self, spec: CommandSpec) -> None:
        if spec.needs_arg:
            self.app.input.give_back(spec.name + " ")
        else:
            await self.app.submit(spec.name)
