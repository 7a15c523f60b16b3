"""The app's side of editing an earlier message (Ctrl+E): choose it, send `/edit N TEXT`
through the keeper, and redraw the transcript from message N on when the edit is reported.
"""

from __future__ import annotations

from chatapp.chat.events import Branched
from chatapp.tui.face import Face
from chatapp.tui.input import ChatInput


class Editing:
    def __init__(self, app: Face) -> None:
        self.app = app

    def edit_message(self) -> None:
        """Ctrl+E: edit an earlier message: the one Up recalled if it is in the transcript, else
        the last one."""
        box, transcript = self.app.input, self.app.transcript
        if self.app.session is None:
            self.app.notify("The model is still loading.", severity="warning")
            return
        choices = transcript.editable()
        if not choices:
            self.app.notify("No message to edit yet.", severity="warning")
            return
        texts = [text for _, text in choices]
        shown = box.text if box.recalled is not None else None
        index = len(texts) - 1 - texts[::-1].index(shown) if shown in texts else len(texts) - 1
        box.start_edit(choices, index)

    def chosen(self, msg: ChatInput.Chosen) -> None:
        """Highlight the message the box points at: the one being edited, or the latest one
        with the recalled text (Ctrl+E would edit that one)."""
        transcript = self.app.transcript
        number = msg.number
        if number is None and msg.text is not None:
            number = next((n for n, text in reversed(transcript.editable()) if text == msg.text), None)
        transcript.highlight(number)

    def cancel_edit(self) -> bool:
        """Esc while editing (and no reply running): back to a plain box. False: not editing."""
        box = self.app.input
        if box.editing is None:
            return False
        box.cancel_edit()
        return True

    async def show_branch(self, ev: Branched) -> None:
        """/edit was reported: from message N on, the transcript shows the new message (the
        panel's turn figures follow from the session's, which the edit pruned)."""
        transcript = self.app.transcript
        transcript.highlight(None)
        await transcript.cut_from(ev.from_message)
        await transcript.notice(ev.line + ".", "dim")
        await transcript.add_user(ev.text)
