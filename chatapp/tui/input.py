"""The multi-line input box: Enter sends, Ctrl+J inserts a newline, Up/Down recall history.
Ctrl+E (the app's binding) puts it in "editing message N" mode: Up/Down choose another earlier
message while the text is unchanged, Enter sends the edit (`/edit N TEXT`), Esc cancels.

Terminals send the same byte for Enter and Shift+Enter unless they speak the kitty keyboard
protocol, so the newline key that works everywhere is Ctrl+J; Shift+Enter and Alt+Enter
also work where the terminal reports them. A bracketed paste arrives as one Paste event,
so a pasted text with newlines is inserted whole and never sent line by line. A paste over
PASTE_LIMIT characters is not inserted: the app attaches it to the next message instead, since
the box re-wraps its text on every keystroke (a 1 MB single-line paste made each key take
seconds).
"""

from __future__ import annotations

import os

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.strip import Strip
from textual.widgets import TextArea

from chatapp.chat.commands import completions

PASTE_LIMIT = 10_000  # characters; below this a keystroke stays well under 50 ms (docs/tui.md)


class ChatInput(TextArea):
    BINDINGS = [
        Binding("enter", "submit", "Send", priority=False),
        Binding("ctrl+j,shift+enter,alt+enter", "newline", "Newline"),
        # TextArea's Ctrl+E (line end; End still does it) becomes: edit an earlier message
        Binding("ctrl+e", "edit_message", "Edit message", show=False),  # F1 lists it: the footer stays as it was
    ]

    class Submitted(Message):
        def __init__(self, text: str, editing: int | None = None) -> None:
            super().__init__()
            self.text = text
            self.editing = editing  # the number of the message this text replaces (/edit), if any

    class EditWanted(Message):
        """Ctrl+E: the app picks the message (it knows the transcript) and calls start_edit."""

    class Chosen(Message):
        """The message the box points at changed (recalled or being edited): the app highlights it."""

        def __init__(self, text: str | None, number: int | None = None) -> None:
            super().__init__()
            self.text, self.number = text, number

    class LargePaste(Message):
        """A paste too large for the box: the app attaches it instead."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.past: list[str] = []  # sent messages (TextArea.history is its undo stack)
        self.recalled: int | None = None  # index into `past` while browsing it
        self.choices: list[tuple[int, str]] = []  # (number, text) of the messages /edit can take
        self.choice: int | None = None  # index into `choices` while editing one

    @property
    def editing(self) -> int | None:
        """The number of the message being edited, or None."""
        return self.choices[self.choice][0] if self.choice is not None else None

    def render_line(self, y: int) -> Strip:
        # Mid-resize on a narrow terminal the box can have no text columns for a frame, and
        # TextArea then crashes wrapping its placeholder to width 0: draw that frame blank.
        if self.content_size.width < 1:
            return Strip.blank(self.size.width)
        return super().render_line(y)

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            # Keep TextArea from inserting a newline; the Enter binding (send) then runs.
            event.prevent_default()
        elif event.key == "tab" and self._complete():
            event.stop()  # Tab completed a command name: it does not move the focus this time
            event.prevent_default()
        elif event.key in ("up", "down") and self._choosing():
            event.stop()
            event.prevent_default()
            self._choose(-1 if event.key == "up" else 1)
        elif event.key in ("up", "down") and self._browsing():
            event.stop()
            event.prevent_default()
            self._recall(-1 if event.key == "up" else 1)

    def _complete(self) -> bool:
        """Tab after `/` and part of a command's name: the name completed from the command table
        (to what the matches share, listed, when several match). False: Tab moves the focus."""
        text = self.text
        if text.startswith("//") or not text.startswith("/") or any(c.isspace() for c in text):
            return False
        names = completions(text)
        if not names:
            self.app.notify(f"No command starts with {text}; /help lists them", severity="warning", timeout=3,
                            markup=False)
            return True
        done = names[0] if len(names) == 1 else os.path.commonprefix(names)
        if len(names) > 1:
            self.app.notify("  ".join(n.strip() for n in names), title="Tab completes", timeout=4)
        self.load_text(done)
        self.move_cursor(self.document.end)
        return True

    def _browsing(self) -> bool:
        """Up/Down walk the history when the box is empty or still shows a recalled entry."""
        if not self.text:
            return bool(self.past)
        return self.recalled is not None and self.text == self.past[self.recalled]

    def _recall(self, step: int) -> None:
        last = len(self.past)
        i = (last if self.recalled is None else self.recalled) + step
        if i >= last:
            self.recalled = None
            self.load_text("")
            return
        self.recalled = max(i, 0)
        self.load_text(self.past[self.recalled])
        self.move_cursor(self.document.end)
        self.post_message(self.Chosen(self.past[self.recalled]))

    # --- editing an earlier message ---------------------------------------------------
    def start_edit(self, choices: list[tuple[int, str]], index: int) -> None:
        """Edit `choices[index]`: its text in the box, its number in the border title."""
        self.choices, self.recalled = choices, None
        self._choose_at(index)
        self.add_class("editing")
        self.focus()

    def _choosing(self) -> bool:
        """Up/Down choose another message while the box still shows the chosen one's text."""
        return self.choice is not None and self.text == self.choices[self.choice][1]

    def _choose(self, step: int) -> None:
        self._choose_at(min(max(self.choice + step, 0), len(self.choices) - 1))

    def _choose_at(self, index: int) -> None:
        self.choice = index
        number, text = self.choices[index]
        self.load_text(text)
        self.move_cursor(self.document.end)
        self.border_title = f"editing message {number}: Enter sends, Up/Down another, Esc cancels"
        self.post_message(self.Chosen(text, number))

    def cancel_edit(self) -> None:
        """Back to a plain, empty box."""
        self.end_edit()
        self.load_text("")
        self.post_message(self.Chosen(None))

    def end_edit(self) -> None:
        self.choices, self.choice, self.border_title = [], None, None
        self.remove_class("editing")

    def action_submit(self) -> None:
        text = self.text
        if not text.strip():
            return
        self.post_message(self.Submitted(text, self.editing))

    def accept(self, text: str) -> None:
        """The app took the text: remember it and empty the box."""
        if not self.past or self.past[-1] != text:
            self.past.append(text)
        self.recalled = None
        self.end_edit()
        self.load_text("")

    def give_back(self, text: str) -> None:
        """A message the app could not take: back in the box, the cursor at its end to go on typing."""
        self.load_text(text)
        self.move_cursor(self.document.end)
        self.focus()

    def action_edit_message(self) -> None:
        self.post_message(self.EditWanted())

    def action_newline(self) -> None:
        self.insert("\n")

    async def _on_paste(self, event: events.Paste) -> None:
        if len(event.text) > PASTE_LIMIT:
            event.prevent_default()  # TextArea's own handler would insert it
            event.stop()
            self.post_message(self.LargePaste(event.text))
