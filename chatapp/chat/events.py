"""Every event that crosses from the chat (session and keeper) to the faces (TUI, headless).

Each has a fixed `event` kind, the name headless mode prints; faces dispatch on the class with
`match`. One serializer (`to_json`) makes the headless JSON from them, so the JSON fields and
the panel's labels cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from chatapp.chat.figures import counted

# What a reply's text is (chatapp/chat/kinds.py): the answer, its thinking block (Qwen3's
# <think>, markers left out), or nanochat's calculator call and the output forced after it
# (those two keep their marker tokens' text: it is what the model wrote).
TextKind = Literal["answer", "thinking", "tool_call", "tool_result"]


@dataclass
class TextDelta:
    text: str
    kind: TextKind = "answer"


@dataclass
class ToolCall:
    expr: str
    result: str | None  # None: invalid expression, no output block was forced


@dataclass
class TurnStats:
    turn: int
    user: str
    reply: str
    prefill_tokens: int      # tokens pushed through the model before the first reply token, a trim's re-prefill in
    cached_before: int       # history reused from the cache, not recomputed (0 after a trim: it recomputed all)
    cache_seqlens: int       # after the turn
    capacity: int
    decode_tokens: int
    ttft_ms: float           # the wait for the first token: its prefill, and a trim's re-prefill before it
    tokens_per_s: float
    stop: str                # "end" | "length" (max_new_tokens) | "context" (the cache is full) | "cancel"
    kv_bytes_used: int
    kv_bytes_allocated: int
    backend: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    thinking: str = ""       # the reply's thinking block, left out of `reply`
    reprefilled_tokens: int = 0  # of prefill_tokens, those a trim re-prefilled (chat/trim.py)
    rss_bytes: int = 0       # the process's resident memory as the turn ended: the panel's "process RSS"
    event: str = "turn"


@dataclass
class Trimmed:
    """The context was full: the oldest exchanges left it and what is kept was re-prefilled
    (chat/trim.py), as part of the turn that follows (its TurnStats count this in). The chat
    calls them trimmed (`Session.trimmed`, dimmed in the TUI); the JSON keeps its `dropped_*`
    field names, which scripts read."""

    dropped_exchanges: int
    dropped_tokens: int
    reprefilled_tokens: int
    cache_seqlens: int
    capacity: int
    reprefill_ms: float = 0.0
    event: str = "trim"


@dataclass
class Prefilling:
    """Progress of a long prefill the user waits for (a trim's re-prefill, a /model switch's):
    `done` of `total` tokens are in the cache. The first comes at 0, the last at `total`. Faces may show it."""

    done: int
    total: int
    reason: Literal["trim", "model"] = "trim"   # a trim's re-prefill, or a /model switch carrying the chat
    model: str = ""                             # /model: the model being filled
    event: str = "prefill"


@dataclass
class Memory:
    """The process's memory (chat/memory.py reads it): RSS, and on CUDA the allocator's figures."""

    rss: int
    cuda_allocated: int | None = None
    cuda_reserved: int | None = None


@dataclass
class Progress:
    """A turn in flight, from the worker that runs it: after each prefill chunk, and at most
    every `chat/reply.py`'s PROGRESS_S while decoding. What a face shows live (the TUI's panel
    and prefill bar); headless mode skips it."""

    phase: Literal["prefill", "decode"]
    done: int                # prefill: this turn's pending tokens now in the cache; decode: tokens written
    total: int               # prefill: the tokens this turn prefills; decode: max_new_tokens, else the room left
    elapsed_s: float         # since the reply started (its prefill)
    cache_seqlens: int
    capacity: int
    kv_bytes_used: int
    memory: Memory
    event: str = "progress"


@dataclass
class SessionFigures:
    """The session's figures as the worker leaves them after an input (a turn, a command, a
    load): its /stats, the process's memory, and the chat's per-turn figures (the session's one
    list, copied). What the TUI's panel shows between turns; headless mode never sees it."""

    stats: dict
    memory: Memory
    turns: list[TurnStats] = field(default_factory=list)
    history: list[int] = field(default_factory=list)  # prefill tokens per turn, a reopened chat's too
    event: str = "figures"


# What moved the cache: a new chat, retry's rewind, an undone exchange, a new system prompt,
# a turn the model failed in, put back as it was before it, or /edit's rewind to an earlier message.
CacheStep = Literal["reset", "retry", "undo", "system", "undone", "edit"]


@dataclass
class CacheState:
    """After a command that moves the cache without a turn."""

    event: CacheStep
    cache_seqlens: int
    capacity: int
    tokens: int              # conversation tokens (cached + pending)
    detail: str = ""


@dataclass
class Ready:
    """Headless mode's first line: the chat is open. Its JSON is one flat object: the session's
    /stats figures, then what the keeper says of the chat (store, chat id, title, restore)."""

    figures: dict
    stored: dict = field(default_factory=dict)   # the keeper's ready_fields(): store, chat id, title, restore
    event: str = "ready"


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


@dataclass
class Saved:
    """/save: the chat is in the database, its snapshot up to date."""

    chat: int
    title: str
    messages: int
    snapshot_tokens: int
    snapshot_bytes: int
    event: str = "saved"


@dataclass
class Restored:
    """A stored chat reopened (/load, --chat, --resume): how its cache came back."""

    chat: int
    title: str
    restored_tokens: int      # K/V loaded from the snapshot: not recomputed
    reprefilled_tokens: int   # recomputed from the stored token ids
    pending_tokens: int       # left for the next turn's prefill (a reply's closing tokens)
    messages: int
    cache_seqlens: int
    capacity: int
    detail: str               # why the snapshot was not (fully) used; "" when it was
    event: str = "load"

    @property
    def line(self) -> str:
        """The one line the faces show, e.g. in the cache panel."""
        if self.reprefilled_tokens == 0 and self.restored_tokens:
            why = f" ({self.detail})" if self.detail else ""  # e.g. the chat's own model is missing
            return f"restored {self.restored_tokens} tokens from snapshot{why}"
        parts = [f"restored {self.restored_tokens} tokens from snapshot"] if self.restored_tokens else []
        parts.append(f"re-prefilled {self.reprefilled_tokens} tokens")
        return ", ".join(parts) + (f" ({self.detail})" if self.detail else "")


@dataclass
class Branched:
    """/edit N TEXT, before its rewind: the chat goes on from message N with TEXT, and what
    followed from N on is kept as stored chat `branch` (None: chats are not kept here)."""

    chat: int | None          # the edited chat: it keeps its id
    branch: int | None        # the stored copy of the chat as it was before the edit
    title: str                # the branch's title
    from_message: int         # N: the exchange number as shown, trimmed ones counted
    text: str                 # the new message
    snapshot_tokens: int      # K/V positions the branch's snapshot shares with the chat (linked files)
    event: str = "branch"

    @property
    def line(self) -> str:
        kept = (f"the old continuation is kept as chat #{self.branch}" if self.branch is not None
                else "the old continuation is not kept (chats are not stored)")
        return f"Edited message {self.from_message}; {kept}"


@dataclass
class Copied:
    """/copy: a reply's text for the clipboard (the TUI copies it; headless mode prints it)."""

    reply: int               # its number in the chat, 1 for the first
    of: int                  # how many replies the chat has
    text: str
    event: str = "copy"


@dataclass
class ModelSwitched:
    """/model: the new model holds the conversation (re-rendered for its template, re-prefilled)."""

    model: str
    previous: str
    exchanges: int            # carried in the context
    dropped_exchanges: int    # moved out of it: the new context is smaller
    reprefilled_tokens: int
    cache_seqlens: int
    capacity: int
    load_s: float
    prefill_s: float
    system: str               # the prompt the chat now runs with (a default one follows the model)
    event: str = "model"

    @property
    def line(self) -> str:
        dropped = f", {self.dropped_exchanges} oldest left the context" if self.dropped_exchanges else ""
        return (f"{self.model}: carried {counted(self.exchanges, 'exchange')}{dropped}, re-prefilled "
                f"{self.reprefilled_tokens} tokens in {self.prefill_s:.1f} s")


Event = (TextDelta | ToolCall | TurnStats | Trimmed | CacheState | Info | Error | Quit | Saved | Restored
         | Prefilling | Branched | Copied | ModelSwitched | Ready | Progress | SessionFigures)


def to_json(ev: Event) -> dict:
    if isinstance(ev, Ready):  # flat, as its line has always been
        return {"event": ev.event, **ev.figures, **ev.stored}
    d = dataclasses.asdict(ev)
    d = {"event": d.pop("event"), **d}
    if isinstance(ev, (TurnStats,)):
        d["ttft_ms"] = round(ev.ttft_ms, 2)
        d["tokens_per_s"] = round(ev.tokens_per_s, 2)
    if isinstance(ev, ModelSwitched):
        d["load_s"], d["prefill_s"] = round(ev.load_s, 3), round(ev.prefill_s, 3)
    if isinstance(ev, Trimmed):
        d["reprefill_ms"] = round(ev.reprefill_ms, 2)
    return d
