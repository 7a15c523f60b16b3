"""Typed events that cross from the session to the faces (TUI, headless).

One serializer (`to_json`) makes the headless JSON from them, so the JSON fields and
the panel's labels cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class TextDelta:
    text: str


@dataclass
class ToolCall:
    expr: str
    result: str | None  # None: invalid expression, no output block was forced


@dataclass
class TurnStats:
    turn: int
    user: str
    reply: str
    prefill_tokens: int      # tokens pushed through the model before the first reply token
    cached_before: int       # cache_seqlens when the turn started: history reused, not recomputed
    cache_seqlens: int       # after the turn
    capacity: int
    decode_tokens: int
    ttft_ms: float
    tokens_per_s: float
    stop: str                # "end" | "length" | "cancel"
    kv_bytes_used: int
    kv_bytes_allocated: int
    backend: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    event: str = "turn"


@dataclass
class Trimmed:
    dropped_exchanges: int
    dropped_tokens: int
    reprefilled_tokens: int
    cache_seqlens: int
    capacity: int
    event: str = "trim"


@dataclass
class CacheState:
    """After a command that moves the cache: reset, retry's rewind, undo, system, restore."""

    event: str               # "reset" | "undo" | "system" | "set" | ...
    cache_seqlens: int
    capacity: int
    tokens: int              # conversation tokens (cached + pending)
    detail: str = ""


@dataclass
class Info:
    text: str
    data: dict = field(default_factory=dict)
    event: str = "info"


@dataclass
class Error:
    message: str
    event: str = "error"


@dataclass
class Quit:
    event: str = "quit"


Event = TextDelta | ToolCall | TurnStats | Trimmed | CacheState | Info | Error | Quit


def to_json(ev: Event) -> dict:
    d = dataclasses.asdict(ev)
    d = {"event": d.pop("event"), **d}
    if isinstance(ev, (TurnStats,)):
        d["ttft_ms"] = round(ev.ttft_ms, 2)
        d["tokens_per_s"] = round(ev.tokens_per_s, 2)
    return d
