"""What the session's helpers (reply, respond, stats, trim, undoable, whole) may use of it.

They are functions of one session, split out of `session.py` to keep it one idea; typing their
argument with this protocol instead of `Session` keeps the import arrow one way (session.py
imports them, never the reverse, not even for a type hint: tests/test_layering.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # type hints only: the --backend path (chat/undoable.py) must not load torch
    from chatapp.chat.events import CacheState, Event, TurnStats
    from chatapp.chat.exchange import Exchange
    from chatapp.chat.settings import Settings
    from kvcache import KVCache
    from model.decode.generate import Generator
    from model.loading import LoadedModel


class SessionLike(Protocol):
    """The session as its helpers see it: the invariant's state (the cache holds
    `tokens[:cache.seqlen]`, docs/cache-invariant.md) and the few methods they call back."""

    lm: LoadedModel
    tokenizer: object        # model/tokenizers/
    template: object         # the chat format (model/chat_formats/)
    settings: Settings
    cache: KVCache
    gen: Generator
    cancel_flag: threading.Event
    tokens: list[int]
    exchanges: list[Exchange]
    trimmed: list[Exchange]  # trimmed out of the context: kept for the transcript and the store
    turn_stats: list[TurnStats]
    snapshot_budget: int | None  # the store's bytes of KV snapshots on disk (its keeper sets it)

    @property
    def system(self) -> str: ...

    @property
    def turns(self) -> int: ...

    def truncate(self, n: int) -> None: ...

    def state(self, event: str, detail: str = "") -> CacheState: ...

    def user_tokens(self, text: str, first: bool) -> list[int]: ...

    def turn(self, text: str, new: list[int]) -> Iterator[Event]: ...
