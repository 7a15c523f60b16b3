"""The app's side of editing an earlier message (Ctrl+E): choose it, send `/edit N TEXT`
through the keeper, and redraw the transcript from message N on when the edit is reported.

`ChatApp`'s base, so the app itself only forwards the edit line, the `Branched` event and Esc.
"""

from __future__ import annotations

from textual.app import App

from chatapp.chat.events import Branched
from chatapp.tui.input import ChatInput
from chatapp.tui.transcript import Transcript


class Editing(App[None]):
    def on_chat_input_edit_wanted(self, _msg: ChatInput.EditWanted) -> None:
        self.edit_message()

    def edit_message(self) -> None:
        """Ctrl+E: edit an earlier message: the one Up recalled if it is in the transcript, else
        the last one."""
        box, transcript = self.query_one(ChatInput), self.query_one(Transcript)
        if box.disabled:
            self.notify("The model is still loading.", severity="warning")
            return
        choices = transcript.editable()
        if not choices:
            self.notify("No message to edit yet.", severity="warning")
            return
        texts = [text for _, text in choices]
        shown = box.text if box.recalled is not None else None
        index = len(texts) - 1 - texts[::-1].index(shown) if shown in texts else len(texts) - 1
        box.start_edit(choices, index)

    def on_chat_input_chosen(self, msg: ChatInput.Chosen) -> None:
        """Highlight the message the box points at: the one being edited, or the latest one
        with the recalled text (Ctrl+E would edit that one)."""
        transcript = self.query_one(Transcript)
        number = msg.number
        if number is None and msg.text is not None:
            number = next((n for n, text in reversed(transcript.editable()) if text == msg.text), None)
        transcript.highlight(number)

    def cancel_edit(self) -> bool:
        """Esc while editing (and no reply running): back to a plain box. False: not editing."""
        box = self.query_one(ChatInput)
        if box.editing is None:
            return False
        box.cancel_edit()
        return True

    async def show_branch(self, ev: Branched) -> None:
        """/edit was reported: from message N on, the transcript shows the new message."""
        transcript = self.query_one(Transcript)
        transcript.highlight(None)
        await transcript.cut_from(ev.from_message)
        await transcript.notice(ev.line + ".", "dim")
        await transcript.add_user(ev.text)
