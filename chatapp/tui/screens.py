"""The help screen: commands and keys."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from chatapp.chat.commands import help_rows

KEYS = [
    ("Enter", "send the message (or run the /command)"),
    ("Ctrl+J", "new line in the message (Shift+Enter, Alt+Enter: where the terminal sends them)"),
    ("Up / Down", "recall earlier messages when the box is empty"),
    ("Ctrl+E", "edit an earlier message (the one Up recalled, else the last; Up/Down: another), "
               "Enter sends it, Esc cancels"),
    ("Esc", "stop the reply being written; the partial reply is kept"),
    ("Ctrl+P", "command palette: every /command"),
    ("Ctrl+O", "the stored chats: open, rename, delete, start a new one (also /load)"),
    ("Tab", "move focus to the transcript to scroll it (PageUp, PageDown, mouse wheel)"),
    ("Ctrl+Y", "copy the last reply to the clipboard (/copy N: another one)"),
    ("[ / ]", "in the transcript: select the previous / next code block (a click also selects one)"),
    ("c", "in the transcript: copy the selected code block (none selected: the last one)"),
    ("r", "in the transcript: the raw text of the selected block's reply, else the last (/raw N: any)"),
    ("F1", "this help"),
    ("Ctrl+Q", "quit"),
]


def help_content() -> Content:
    """Two aligned tables, commands then keys; the commands come from the one command table."""
    commands = help_rows(tui=True)
    width = max(len(name) for name in [*(u for u, _ in commands), *(k for k, _ in KEYS)]) + 2
    lines: list[Content] = [Content.styled("Commands", "bold")]
    lines += [Content.assemble((f"{usage:<{width}}", "bold $accent"), desc) for usage, desc in commands]
    lines += [Content(""), Content.styled("Keys", "bold")]
    lines += [Content.assemble((f"{key:<{width}}", "bold $accent"), desc) for key, desc in KEYS]
    return Content("\n").join(lines)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(help_content())
            yield Label("Esc closes this help.", classes="hint")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
