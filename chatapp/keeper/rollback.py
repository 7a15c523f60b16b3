"""Opening a chat is a transaction: either the new chat is fully in place, or the old one is back
exactly as it was, with its id.

`ChatKeeper.open` adopts the stored chat into the session and then refills the cache (snapshot,
prefill). Anything can fail after the adopt step: a stored token id past the vocabulary, out of
memory in prefill, a cache overflow. Had the keeper kept the half-adopted session, the next
save would write the other chat's messages under the old chat's id (issue 27). So the keeper
takes a `Checkpoint` of the session first (and keeps its own fields that name the stored chat),
and puts both back on any failure.

What comes back here: the token list, exchanges, trimmed exchanges, turn figures and settings of the
session. The cache's K/V were overwritten by the failed refill; they come back from the old
chat's own KV snapshot where it covers them, and the rest is left pending (the invariant holds:
the next turn prefills it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from chatapp.chat.session import Exchange, Session
from chatapp.keeper.reopen import from_snapshot
from chatapp.store.identity import ModelIdentity


@dataclass
class Checkpoint:
    tokens: list[int]
    exchanges: list[Exchange]
    trimmed: list[Exchange]
    turn_stats: list
    settings: Any
    cache_seqlens: int


def copy_exchanges(exchanges: list[Exchange]) -> list[Exchange]:
    return [replace(ex, tool_calls=list(ex.tool_calls)) for ex in exchanges]


def take(s: Session) -> Checkpoint:
    return Checkpoint(list(s.tokens), copy_exchanges(s.exchanges), copy_exchanges(s.trimmed), list(s.turn_stats),
                      dataclasses.replace(s.settings), s.cache.seqlen)


def put_back(s: Session, cp: Checkpoint, identity: Callable[[], ModelIdentity], folder: Path | None) -> int:
    """The session as `cp` took it. Returns how many cache positions came back from the old
    chat's snapshot in `folder` (None: it has none); the rest of its tokens are pending."""
    s.cache.reset()
    s.gen.forget()
    s.tokens, s.exchanges, s.trimmed = cp.tokens, cp.exchanges, cp.trimmed
    s.turn_stats, s.settings = cp.turn_stats, cp.settings
    n = 0
    if folder is not None and cp.cache_seqlens:
        try:
            n, _why = from_snapshot(s, s.tokens, identity(), folder, cp.cache_seqlens)
        except Exception:  # the snapshot is only a shortcut: without it the tokens stay pending
            s.cache.reset()
            n = 0
    s.gen.forget()
    return n
