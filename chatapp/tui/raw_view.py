"""A reply's raw text, without Markdown: `/raw [N]` and `r` on the transcript.

A small model's Markdown is often malformed: unfenced code loses its indentation, a `# comment`
becomes a heading, an indented paragraph a clipped code block. The raw view shows the reply as
the model wrote it (its answer text, as `/copy` takes it), every space kept, in a read-only box
that scrolls and lets a mouse select.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, TextArea

from chatapp.chat.clip import pick_reply
from chatapp.tui.transcript import Reply, Transcript
from chatapp.tui.visible import visible
from model.errors import UserError


class RawScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q", "dismiss", "Close")]
    DEFAULT_CSS = """
    RawScreen { align: center middle; }
    RawScreen > Vertical { width: 90%; height: 90%; border: round $accent; background: $surface; }
    RawScreen TextArea { height: 1fr; border: none; }
    """

    def __init__(self, text: str, title: str) -> None:
        super().__init__()
        self.text, self.title = text, title

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = self.title
            yield TextArea(visible(self.text), read_only=True, soft_wrap=True, show_line_numbers=False, id="raw")
            yield Label("The reply as the model wrote it, no Markdown. Esc closes.", classes="hint")

    def on_mount(self) -> None:
        self.query_one(TextArea).focus()

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)


def raw_screen(transcript: Transcript, arg: str = "", reply: Reply | None = None) -> RawScreen:
    """The raw view of reply `arg` (/copy's numbers: 1 the first, -1 the last) or of `reply`;
    UserError when there is none, or it holds no text."""
    replies = list(transcript.query(Reply))  # the dimmed ones a trim took out count: they are numbered
    n = replies.index(reply) + 1 if reply in replies else pick_reply(arg, len(replies), "/raw")
    text = replies[n - 1].text
    if not text.strip():
        raise UserError(f"/raw: reply {n} has no text")
    return RawScreen(text, f"reply {n} of {len(replies)}, raw text")
