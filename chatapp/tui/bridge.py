"""From the session's event stream (in a worker thread) to batched, thread-safe UI messages.

A reply can stream hundreds of tokens a second. Posting one message per token would flood
the event loop and re-render Markdown per token, so text deltas are joined and posted at
most every `interval` seconds; every other event flushes the text first, to keep order.
`post` is `App.post_message`, which is safe to call from any thread and never blocks.

The `Gate` adds back-pressure: one batch is in flight at a time, and the next waits at least
DRAW_SHARE times as long as the UI took to draw the last one. Drawing holds the GIL and a core,
and on a 2-core laptop the decode's threads need both: with the UI allowed half the time, a
numbered reply decoded at 40-60% of headless speed; at a seventh, 65-85%
(docs/notes.md, "The TUI starved the model"). MAX_WAIT_S keeps the text moving at least once a
second on a long transcript whose every draw is slow.

The load worker's messages (`Loaded`, `LoadProgress`, `LoadFailed`) cross the same way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from textual.message import Message

from chatapp.chat.events import Error, Event, Progress, SessionFigures, TextDelta, TextKind
from model.errors import unexpected

BATCH_INTERVAL_S = 0.05
DRAW_SHARE = 6   # the next batch waits this many times the last one's draw: the UI busy <= 1/7 of the time
MAX_WAIT_S = 1.0


class TextBatch(Message):
    """Reply text: one or more deltas of one kind, joined."""

    def __init__(self, text: str, kind: TextKind = "answer") -> None:
        super().__init__()
        self.text, self.kind = text, kind


class SessionEvent(Message):
    """Any other session event (tool call, turn stats, cache state, info, error, quit)."""

    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


class TurnFinished(Message):
    """The worker is done with one input: the UI may take the next one. `figures`: the
    session's, read by the worker as it left them (None if that failed)."""

    def __init__(self, figures: SessionFigures | None = None) -> None:
        super().__init__()
        self.figures = figures


class Loaded(Message):
    """From the load worker: the keeper (a ChatKeeper, or --backend's RemoteKeeper) is ready, and
    its session's figures."""

    def __init__(self, keeper, figures: SessionFigures | None) -> None:
        super().__init__()
        self.keeper, self.figures = keeper, figures


class LoadProgress(Message):
    """A line from the loader; a pull's progress events also carry the fraction done."""

    def __init__(self, progress: object) -> None:
        super().__init__()
        self.text = str(progress)
        self.fraction: float | None = getattr(progress, "fraction", None)


class LoadFailed(Message):
    """From the load worker: one readable line."""

    def __init__(self, text: str, title: str = "The model could not be loaded") -> None:
        super().__init__()
        self.text, self.title = text, title


class Gate:
    """One text batch in flight. The worker calls `ready`/`sent`; the UI calls `drawn`."""

    def __init__(self, interval: float = BATCH_INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        self.interval, self.clock = interval, clock
        self._open = threading.Event()
        self._open.set()
        self.sent_at = float("-inf")  # the first delta goes out at once: time to first token is felt
        self.draw_s = 0.0

    def ready(self) -> bool:
        wait = min(max(self.interval, DRAW_SHARE * self.draw_s), MAX_WAIT_S)
        return self._open.is_set() and self.clock() - self.sent_at >= wait

    def sent(self) -> None:
        self._open.clear()
        self.sent_at = self.clock()

    def drawn(self) -> None:
        """From the UI thread, once the batch is on screen."""
        self.draw_s = self.clock() - self.sent_at
        self._open.set()


def pump(events: Iterable[Event], post: Callable[[Message], object], gate: Gate | None = None,
         figures: Callable[[], SessionFigures] | None = None) -> int:
    """Drain `events` into `post`, then the session's `figures()` (read in this thread, which owns
    the session) with TurnFinished; returns how many TextBatch messages were posted. `Progress`
    waits for the gate like text (only the latest is kept): it fires four times a second while the
    model writes, and flushing the text for each one let the batches past the gate."""
    gate = gate or Gate()
    pending: list[str] = []
    kind: TextKind = "answer"  # what `pending` is: a batch never mixes kinds
    progress: Progress | None = None
    batches = 0

    def flush() -> None:
        nonlocal batches, progress
        if pending:
            gate.sent()
            post(TextBatch("".join(pending), kind))
            pending.clear()
            batches += 1
        if progress is not None:
            post(SessionEvent(progress))
            progress = None

    try:
        for ev in events:
            if isinstance(ev, TextDelta):
                if ev.kind != kind:
                    flush()
                    kind = ev.kind
                pending.append(ev.text)
            elif isinstance(ev, Progress):
                progress = ev
            else:
                flush()
                post(SessionEvent(ev))
                continue
            if gate.ready():
                flush()
    except Exception as e:  # a bug in a turn must not take the whole UI down with it
        flush()
        post(SessionEvent(Error(unexpected(e))))
    finally:
        flush()
        post(TurnFinished(read_figures(figures)))
    return batches


def read_figures(figures: Callable[[], SessionFigures] | None) -> SessionFigures | None:
    try:
        return figures() if figures is not None else None
    except Exception:  # the panel keeps its last figures; the turn's own error is already posted
        return None
