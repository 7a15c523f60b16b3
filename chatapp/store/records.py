"""What the store keeps and how it refuses: a chat as stored (`ChatRecord`), its messages, the
chats list's rows, and the store's errors in words a user can act on. No SQL here:
chatapp/store/database.py reads and writes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from model.errors import UserError


class StoreError(UserError):
    """The store cannot do what was asked; the message is one line for the user."""


class ChatChanged(StoreError):
    """Another window saved this chat since we last read or wrote it."""


@dataclass
class StoredMessage:
    role: str                 # "user" | "assistant"
    content: str
    token_ids: list[int]
    tool_calls: list[dict] = field(default_factory=list)
    stop: str = ""            # a reply's stop reason (TurnStats.stop); "" for user rows and v1 stores


@dataclass
class ChatRecord:
    """A whole chat as stored. `id` None: not stored yet."""

    title: str
    model: str
    model_fingerprint: str
    tokenizer_fingerprint: str
    settings: dict
    system: str
    prefix_tokens: list[int]
    cache_seqlens: int   # the SQL column keeps its first name, cache_pos (schema.py)
    messages: list[StoredMessage] = field(default_factory=list)
    id: int | None = None
    created: float = 0.0
    updated: float = 0.0
    damage: list[str] = field(default_factory=list)  # cells that could not be read as stored (validate.py)


@dataclass
class ChatSummary:
    id: int
    title: str
    model: str
    updated: float
    messages: int
    damaged: bool = False  # a cell SQL can tell is corrupt: the list marks it (validate.DAMAGED_SQL)


def describe(e: BaseException) -> str:
    """sqlite3/OS errors in words a user can act on."""
    text = str(e)
    if "locked" in text or "busy" in text:
        return "the database is locked by another program (another nanochat-tui?)"
    if "readonly" in text or "read-only" in text:
        return "the database is read-only"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror} ({e.filename})" if e.filename else e.strerror
    return text
