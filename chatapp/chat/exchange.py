"""One exchange of a chat: a user message and its reply, as spans of the session's token list."""

from __future__ import annotations

from dataclasses import dataclass, field

from chatapp.chat.events import ToolCall
from chatapp.chat.kinds import Part


@dataclass
class Exchange:
    """A user message and its reply, as spans of the token list."""

    user: str
    start: int              # first token of the user turn
    reply_start: int        # first token of the reply (after the assistant header)
    end: int = -1           # after the reply's closing tokens
    reply: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    stop: str = ""           # why the reply ended (TurnStats.stop); kept by the store, shown on reload
    parts: list[Part] = field(default_factory=list)  # the reply by kind as it streamed; [] when known as text only
