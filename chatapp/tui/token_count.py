"""The input box's live token count: what the message will cost before it is sent.

Counted with the model's own tokenizer (the text alone; the turn's template markers add a few)
a moment after typing stops, so a fast typist never waits on it. It sits on the box's bottom
border beside the attachments, and says so when the message is more than one turn can hold.
"""

from __future__ import annotations

from textual.css.query import NoMatches
from textual.widgets import TextArea

COUNT_DELAY_S = 0.15


class TokenCount:
    """ChatApp's part (a mixin): `input_tokens()` is what `show_attached` puts on the border."""

    count_timer = None

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        if event.text_area is not self.input:
            return
        if self.count_timer is not None:
            self.count_timer.stop()
        self.count_timer = self.set_timer(COUNT_DELAY_S, self.count_now)

    def count_now(self) -> None:
        try:
            self.show_attached()
        except NoMatches:  # the timer outlived the screen (the app is closing): nothing to show
            pass

    def input_tokens(self) -> str:
        text, s = self.input.text, self.session
        if s is None or not text.strip() or text.lstrip().startswith("/") and not text.lstrip().startswith("//"):
            return ""
        if s.tok is None:  # a --backend chat: the server's tokenizer is not here
            return ""
        n = len(s.tok.encode(text))
        room = s.message_room
        return f"{n:,} tokens" + (f", more than the {room:,} a message can hold" if n > room else "")
