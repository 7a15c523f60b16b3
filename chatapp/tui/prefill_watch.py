"""A long prefill, seen while it runs: a bar in the transcript (tokens done / total, rate, time
left) and the panel's turn figures for the turn in flight.

Read off `Session.stats()` by the panel's timer (4 times a second while a turn runs): the
generator advances `cache_seqlens` a chunk at a time, and `tokens` already holds the whole
pending turn, so the UI thread needs nothing from the worker but those plain numbers. The bar
appears once more than a chunk is pending and goes with the reply's first text or the turn's
end.
"""

from __future__ import annotations

import time

from chatapp.chat.figures import human_ms
from chatapp.tui.transcript import LoadStatus

LONG = 512   # pending tokens that make a prefill worth a bar: more than one prefill chunk


class PrefillWatch:
    """ChatApp's part (a mixin): `watch_start()` at a turn's start, `watch(stats)` per refresh,
    `watch_end()` at its first text or its end."""

    watching: tuple[float, int] | None = None   # (start time, cache_seqlens at start)
    prefill_bar: LoadStatus | None = None

    def watch_start(self) -> None:
        cache = getattr(self.session, "cache", None)   # a --backend session has no cache of ours to watch
        self.watching = (time.monotonic(), cache.pos) if cache is not None else None

    def watch(self, stats: dict) -> None:
        if self.watching is None:
            return
        t0, base = self.watching
        pos, tokens = stats["cache_seqlens"], stats["tokens"]
        base = min(base, pos)  # a /retry rewinds before it prefills
        self.watching = (t0, base)
        done, total = pos - base, tokens - base
        if total <= 0:
            return
        waited = time.monotonic() - t0
        self.panel.show_inflight(done, total, waited)
        if tokens - pos <= LONG and self.prefill_bar is None:
            return
        rate = done / waited if waited > 0 and done else 0.0
        left = f", {human_ms((total - done) / rate * 1000)} left" if rate else ""
        text = f"prefilling {done:,} / {total:,} tokens ({rate:,.0f} tok/s{left})"
        if self.prefill_bar is None:
            self.prefill_bar = LoadStatus(text)
            self.transcript.mount(self.prefill_bar)
        self.prefill_bar.show(text, done / total)

    def watch_end(self) -> None:
        if self.watching is not None:
            self.panel.show_last_turn()  # in-flight figures give way to the last turn's
        self.watching = None
        if self.prefill_bar is not None:
            self.prefill_bar.remove()
            self.prefill_bar = None
