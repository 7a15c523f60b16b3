"""The help screen: commands and keys."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
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
    ("F2", "hide or show the cache panel (below 100 columns it is a one-line status)"),
    ("Ctrl+Q", "quit"),
]


def help_table(rows: list[tuple[str, str]], width: int) -> list[Horizontal]:
    """One row a name: the name in a column of `width`, its text wrapping within the column beside
    it, so a long line's continuation stays under its own text at any width (a text of padded
    lines wrapped back to the left edge at 80 columns)."""
    out = []
    for name, desc in rows:
        key = Static(Content.styled(name, "bold $accent"), classes="help-key")
        key.styles.width = width
        out.append(Horizontal(key, Static(desc, classes="help-text"), classes="help-row"))
    return out


class HelpScreen(ModalScreen[None]):
    """Commands then keys, two aligned tables; the commands come from the one command table."""

    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        commands = help_rows(tui=True)
        width = max(len(name) for name, _ in [*commands, *KEYS]) + 2
        with VerticalScroll(id="help"):
            yield Label("Commands", classes="help-title")
            yield from help_table(commands, width)
            yield Label("Keys", classes="help-title", id="keys-title")
            yield from help_table(KEYS, width)
            yield Label("Esc closes this help.", classes="hint")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
