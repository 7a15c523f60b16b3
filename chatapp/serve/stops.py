"""The `stop` strings of a request: the reply ends before the first of them, which is never sent.

Text is held back only as long as it could still be the start of a stop string, so a stream
never shows a stop string's first half and then takes it back.
"""

from __future__ import annotations


class StopScanner:
    def __init__(self, stops: list[str]):
        self.stops = stops
        self.held = ""      # received, not yet released: it may begin a stop string
        self.hit = False

    def push(self, text: str) -> str:
        """The text that is safe to send now ("" once a stop string was found)."""
        if self.hit:
            return ""
        if not self.stops:
            return text
        self.held += text
        cuts = [i for i in (self.held.find(s) for s in self.stops) if i >= 0]
        if cuts:
            self.hit = True
            out, self.held = self.held[:min(cuts)], ""
            return out
        keep = max((self.overlap(s) for s in self.stops), default=0)
        out = self.held[:len(self.held) - keep]
        self.held = self.held[len(self.held) - keep:]
        return out

    def overlap(self, stop: str) -> int:
        """The longest tail of the held text that is a proper start of `stop`."""
        for n in range(min(len(stop) - 1, len(self.held)), 0, -1):
            if self.held.endswith(stop[:n]):
                return n
        return 0

    def flush(self) -> str:
        out, self.held = ("" if self.hit else self.held), ""
        return out
