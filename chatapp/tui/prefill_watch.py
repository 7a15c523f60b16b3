"""A long prefill, seen while it runs: a bar in the transcript (tokens done / total, rate, time
left), from the `Progress` events the turn's worker sends after each prefill chunk (the
panel's turn rows show the same events: `CachePanel.apply`). The bar appears once more than a
chunk is pending and goes when the prefill is done, or with any other event of the turn.
"""

from __future__ import annotations

from chatapp.chat.events import Progress
from chatapp.chat.figures import human_ms
from chatapp.tui.transcript import LoadStatus, Transcript

LONG = 512   # pending tokens that make a prefill worth a bar: more than one prefill chunk


class PrefillWatch:
    """The bar's owner: `apply(progress)` per Progress event, `end()` when the turn moves on."""

    def __init__(self, transcript: Transcript) -> None:
        self.transcript = transcript
        self.bar: LoadStatus | None = None

    def apply(self, ev: Progress) -> None:
        if ev.phase != "prefill" or ev.done >= ev.total:
            self.end()
            return
        if self.bar is None and ev.total - ev.done <= LONG:
            return
        rate = ev.done / ev.elapsed_s if ev.elapsed_s > 0 and ev.done else 0.0
        left = f", {human_ms((ev.total - ev.done) / rate * 1000)} left" if rate else ""
        text = f"prefilling {ev.done:,} / {ev.total:,} tokens ({rate:,.0f} tok/s{left})"
        if self.bar is None:
            self.bar = LoadStatus(text)
            self.transcript.mount(self.bar)
        self.bar.show(text, ev.done / ev.total)

    def end(self) -> None:
        if self.bar is not None:
            self.bar.remove()
            self.bar = None
