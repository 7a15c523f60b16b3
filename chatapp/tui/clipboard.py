"""Copying out of the transcript: a reply (Ctrl+Y, /copy) and a code block (the code cursor).

The text goes to the terminal's clipboard through OSC 52 (`App.copy_to_clipboard`), so it
works over SSH and inside tmux (with `set-clipboard on`); the terminal's own mouse selection
would pick up the borders and the side panel too.

The code cursor lives on the transcript: with the transcript focused (Tab), `[` and `]` move
between the code blocks of the replies, the selected one drawn with a bar, and `c` copies it
(with none selected, the last one). A click on a code block selects it as well.
"""

from __future__ import annotations

from textual import events
from textual.app import App
from textual.binding import Binding
from textual.widgets.markdown import MarkdownFence

from chatapp.tui.transcript import Reply, Transcript

SELECTED = "-code-selected"


def copy_text(app: App, text: str, what: str) -> None:
    """Copy through OSC 52 and say so in a short notice."""
    app.copy_to_clipboard(text)
    app.notify(f"Copied {what} ({len(text):,} characters)", timeout=3)


class CodeTranscript(Transcript):
    """The transcript with a cursor over the replies' code blocks."""

    DEFAULT_CSS = f"""
    CodeTranscript MarkdownFence.{SELECTED} {{
        border-left: thick $accent;
    }}
    """
    BINDINGS = [
        # shown in the footer while the transcript has focus: that is where a user learns them
        Binding("left_square_bracket", "code(-1)", "Prev code"),
        Binding("right_square_bracket", "code(1)", "Next code"),
        Binding("c", "copy_code", "Copy code"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.selected: MarkdownFence | None = None

    def code_blocks(self) -> list[MarkdownFence]:
        """The replies' code blocks, top to bottom (a thinking block's text is not Markdown)."""
        return [f for reply in self.query(Reply) for f in reply.query(MarkdownFence)]

    def select(self, fence: MarkdownFence | None) -> None:
        if self.selected is not None:
            self.selected.remove_class(SELECTED)
        self.selected = fence
        if fence is not None:
            fence.add_class(SELECTED)
            self.scroll_to_widget(fence, animate=False)

    def action_code(self, step: int) -> None:
        """Select the previous (-1) or next (1) code block; from none, `[` starts at the last, `]`
        at the first. A block re-rendered since (a finished reply) counts as none."""
        blocks = self.code_blocks()
        if not blocks:
            self.app.notify("No code block in the replies yet.", severity="warning", timeout=3)
            return
        if self.selected in blocks:
            i = max(0, min(len(blocks) - 1, blocks.index(self.selected) + step))
        else:
            i = len(blocks) - 1 if step < 0 else 0
        self.select(blocks[i])

    def action_copy_code(self) -> None:
        blocks = self.code_blocks()
        if not blocks:
            self.app.notify("No code block to copy.", severity="warning", timeout=3)
            return
        if self.selected not in blocks:
            self.select(blocks[-1])
        i = blocks.index(self.selected)
        copy_text(self.app, self.selected.code, f"code block {i + 1} of {len(blocks)}")

    def on_click(self, event: events.Click) -> None:
        """A click on a code block selects it, for `c`."""
        widget = event.widget
        while widget is not None and widget is not self:
            if isinstance(widget, MarkdownFence):
                self.select(widget)
                return
            widget = widget.parent
