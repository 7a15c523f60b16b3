"""Copying out of the transcript: a reply (Ctrl+Y, /copy) and a code block (the code cursor).

The text goes to the terminal's clipboard through OSC 52 (`App.copy_to_clipboard`), so it
works over SSH; the terminal's own mouse selection would pick up the borders and the side panel
too. No terminal answers OSC 52, so the notice says the text was sent, not that it arrived.
Inside tmux, OSC 52 reaches a buffer only with `set-clipboard on` (stock tmux says `external`
and drops it): otherwise the text goes into tmux's paste buffer with `tmux load-buffer -w`
(which also hands it to the terminal where tmux may), and when tmux refuses, into a file.
The notice names which one took it: "Copied" only when one did (issue 44).

The code cursor lives on the transcript: with the transcript focused (Tab), `[` and `]` move
between the code blocks of the replies, the selected one drawn with a bar, and `c` copies it
(with none selected, the last one). A click on a code block selects it as well.
"""

from __future__ import annotations

import os
import subprocess

from textual import events
from textual.app import App
from textual.binding import Binding
from textual.widgets.markdown import MarkdownFence

from chatapp.store.database import data_home
from chatapp.store.tempfiles import write_atomic
from chatapp.tui.raw_view import raw_screen
from chatapp.tui.transcript import Reply, Transcript
from model.errors import UserError

SELECTED = "-code-selected"


COPIED_FILE = "copied.txt"  # in the data folder: where a copy goes when no clipboard takes it


def copy_text(app: App, text: str, what: str) -> None:
    """Copy through OSC 52 (and tmux's buffer, or a file, where OSC 52 cannot land) and say which."""
    app.copy_to_clipboard(text)
    what = f"{what} ({len(text):,} characters)"
    line, kept = (in_tmux(text, what) if os.environ.get("TMUX") else
                  (f"Sent {what} to the terminal's clipboard (OSC 52: the terminal does not confirm it)", True))
    app.notify(line, severity="information" if kept else "warning", timeout=5, markup=False)


def tmux(*args: str, text: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", *args], input=text, capture_output=True, text=True, timeout=5)


def in_tmux(text: str, what: str) -> tuple[str, bool]:
    """Inside tmux: its buffer takes the text, through OSC 52 with set-clipboard on, else by
    load-buffer; a file when tmux refuses both."""
    try:
        mode = tmux("show", "-gv", "set-clipboard").stdout.strip()
        if mode == "on":
            return f"Copied {what} to tmux's paste buffer (set-clipboard on sends it to the terminal too)", True
        done = tmux("load-buffer", "-w", "-", text=text)
        if done.returncode and "-w" in done.stderr:  # tmux before 3.2: no -w
            done = tmux("load-buffer", "-", text=text)
        if done.returncode == 0:
            onward = ("tmux passes it to the terminal, which does not confirm it" if mode == "external" else
                      f"not to the terminal's clipboard: tmux's set-clipboard is {mode or 'unknown'}")
            return f"Copied {what} to tmux's paste buffer (Prefix ] pastes it); {onward}", True
        why = done.stderr.strip() or f"tmux load-buffer exited {done.returncode}"
    except (OSError, subprocess.SubprocessError) as e:
        why = f"tmux could not be run ({e})"
    return to_file(text, what, why)


def to_file(text: str, what: str, why: str) -> tuple[str, bool]:
    path = data_home() / COPIED_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text.encode("utf-8"))
    except OSError as e:
        return f"Not copied: {why}; nor could {path} be written ({e.strerror or e})", False
    return f"Not copied to a clipboard ({why}): {what} is in {path}", False


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
        Binding("r", "raw", "Raw text"),  # the selected block's reply, else the last (/raw N: any)
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

    def action_raw(self) -> None:
        """`r`: the raw text of the reply holding the selected code block, else of the last reply."""
        fence = self.selected if self.selected in self.code_blocks() else None
        reply = next((a for a in fence.ancestors if isinstance(a, Reply)), None) if fence else None
        try:
            self.app.push_screen(raw_screen(self, reply=reply))
        except UserError as e:
            self.app.notify(str(e), severity="error", markup=False)

    def on_click(self, event: events.Click) -> None:
        """A click on a code block selects it, for `c`."""
        widget = event.widget
        while widget is not None and widget is not self:
            if isinstance(widget, MarkdownFence):
                self.select(widget)
                return
            widget = widget.parent
