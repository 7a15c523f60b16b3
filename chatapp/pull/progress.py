"""Progress of `nanochat-tui pull`: a typed event, and the stderr bar that draws it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

STAGES = {"download": "downloading", "verify": "checking sha256", "extract": "extracting",
          "read": "reading GGUF", "convert": "converting"}


@dataclass(frozen=True)
class PullProgress:
    """`done` of `total` in the stage's unit (bytes; tensors for "convert"). `str()` is one line,
    so a plain `print` makes a readable log."""

    stage: str
    done: float
    total: float

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 0.0

    def amount(self) -> str:
        if self.stage == "convert":
            return f"{int(self.done)}/{int(self.total)} tensors"
        if self.stage == "read":
            return ""
        return f"{self.done / 1e6:.1f}/{self.total / 1e6:.1f} MB"

    def __str__(self) -> str:
        amount = f" ({self.amount()})" if self.amount() else ""
        return f"pull: {STAGES.get(self.stage, self.stage)} {self.fraction:4.0%}{amount}"


ProgressFn = Callable[[PullProgress], None]


class Throttled:
    """Passes on the first and last event of each stage, and others at most every `every` s."""

    def __init__(self, fn: ProgressFn, every: float = 0.5):
        self.fn, self.every = fn, every
        self.last_stage, self.last_time = "", 0.0

    def __call__(self, ev: PullProgress) -> None:
        now = time.monotonic()
        edge = ev.stage != self.last_stage or ev.done >= ev.total
        if edge or now - self.last_time >= self.every:
            self.last_stage, self.last_time = ev.stage, now
            self.fn(ev)


class StderrBar:
    """A one-line bar redrawn in place on a terminal; plain lines when stderr is a file."""

    def __init__(self, stream: TextIO | None = None, width: int = 30):
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = self.stream.isatty()
        self.stage = ""
        self.open_line = False

    def __call__(self, ev: PullProgress) -> None:
        filled = int(ev.fraction * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"{STAGES.get(ev.stage, ev.stage):>16} [{bar}] {ev.fraction:4.0%} {ev.amount()}"
        if self.tty:
            end = "\n" if ev.done >= ev.total else ""
            self.stream.write(f"\r{line}\033[K{end}")
        elif ev.stage != self.stage or ev.done >= ev.total:
            self.stream.write(line + "\n")
        self.stage = ev.stage
        self.open_line = self.tty and ev.done < ev.total
        self.stream.flush()

    def interrupt(self) -> None:
        """End a half-drawn bar, so an error message starts on its own line."""
        if self.open_line:
            self.stream.write("\n")
            self.stream.flush()
            self.open_line = False
