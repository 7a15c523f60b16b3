"""The input box's bottom border: the files waiting for the next message, and the message's
live token count (what it will cost before it is sent).

Counted with the model's own tokenizer (the text alone; the turn's template markers add a few)
a moment after typing stops, so a fast typist never waits on it. It says so when the message is
more than one turn can hold.
"""

from __future__ import annotations

from textual.css.query import NoMatches
from textual.widgets import TextArea

from chatapp.tui.face import Face
from chatapp.tui.visible import visible

COUNT_DELAY_S = 0.15


class InputBorder:
    def __init__(self, app: Face) -> None:
        self.app = app
        self.count_timer = None

    def changed(self, event: TextArea.Changed) -> None:
        if event.text_area is not self.app.input:
            return
        if self.count_timer is not None:
            self.count_timer.stop()
        self.count_timer = self.app.set_timer(COUNT_DELAY_S, self.count_now)

    def count_now(self) -> None:
        try:
            self.show()
        except NoMatches:  # the timer outlived the screen (the app is closing): nothing to show
            pass

    def show(self) -> None:
        """The files waiting for the next message, then the token count."""
        s = self.app.session
        att = s.attached if s is not None else None
        parts = [f"attached: {att.summary}" if att and att.files else "", self.input_tokens()]
        self.app.input.border_subtitle = visible(" · ".join(p for p in parts if p))

    def input_tokens(self) -> str:
        text, s = self.app.input.text, self.app.session  # a --backend session has no tokenizer here
        if s is None or s.tokenizer is None or not text.strip():
            return ""
        if text.lstrip().startswith("/") and not text.lstrip().startswith("//"):  # a command
            return ""
        n = len(s.tokenizer.encode(text))
        room = s.message_room
        return f"{n:,} tokens" + (f", more than the {room:,} a message can hold" if n > room else "")

    def mark_sent(self) -> None:
        """The message on screen names the files it carries (the session adds them when it sends)."""
        if files := self.app.session.attached.files:
            self.app.transcript.exchanges[-1].user.border_subtitle = visible("with " + ", ".join(f.name for f in files))
