"""One exchange of a chat: a user message and its reply, as spans of the session's token list."""

from __future__ import annotations

from dataclasses import dataclass, field

from chatapp.chat.events import ToolCall, TurnStats
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


def prefill_history(exchanges: list[Exchange], turn_stats: list[TurnStats], first_turn: int = 1) -> list[int]:
    """Prefill tokens per turn, in order: every turn this session measured (a retry is a turn of
    its own; a trimmed exchange's turns come first), and for an exchange with none (a chat
    reopened by --resume or /load: its turns ran in another process) what it added to the cache
    before its reply, from the previous exchange's end (the first's: from 0, the system prompt
    included) to its reply's start. `first_turn`: the first exchange's turn number."""
    measured: dict[int, list[int]] = {}
    for st in turn_stats:
        measured.setdefault(st.turn, []).append(st.prefill_tokens)
    out = [n for turn in sorted(measured) if turn < first_turn for n in measured[turn]]
    prev_end = 0
    for turn, ex in enumerate(exchanges, first_turn):
        out += measured.get(turn) or [ex.reply_start - prev_end]
        prev_end = ex.end
    return out
