"""Opening a chat is a transaction: either the new chat is fully in place, or the old one is back
exactly as it was, with its id.

`ChatKeeper.open` adopts the stored chat into the session and then refills the cache (snapshot,
prefill). Anything can fail after the adopt step: a stored token id past the vocabulary, out of
memory in prefill, a cache overflow. Had the keeper kept the half-adopted session, the next
save would write the other chat's messages under the old chat's id (issue 27). So the keeper
takes a `Checkpoint` first and puts it back on any failure.

What comes back: the token list, exchanges, trimmed exchanges, turn figures and settings of the session,
and every field of the keeper that names the stored chat. The cache's K/V were overwritten by
the failed refill; they come back from the old chat's own KV snapshot where it covers them, and
the rest is left pending (the invariant holds: the next turn prefills it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from chatapp.chat.session import Exchange
from chatapp.store.reopen import from_snapshot

if TYPE_CHECKING:  # keeper.py imports this module
    from chatapp.store.keeper import ChatKeeper

# the keeper's fields that say which stored chat this window holds and how far it was saved
KEEPER_FIELDS = ("chat_id", "title", "created", "expect", "writer", "clean_upto", "saved_sig", "restored",
                 "ephemeral", "last_error", "said_read_only")


@dataclass
class Checkpoint:
    tokens: list[int]
    exchanges: list[Exchange]
    trimmed: list[Exchange]
    turn_stats: list
    settings: Any
    cache_pos: int
    keeper: dict


def copy_exchanges(exchanges: list[Exchange]) -> list[Exchange]:
    return [replace(ex, tool_calls=list(ex.tool_calls)) for ex in exchanges]


def take(keeper: ChatKeeper) -> Checkpoint:
    s = keeper.session
    return Checkpoint(list(s.tokens), copy_exchanges(s.exchanges), copy_exchanges(s.trimmed), list(s.turn_stats),
                      dataclasses.replace(s.settings), s.cache.pos, {f: getattr(keeper, f) for f in KEEPER_FIELDS})


def put_back(keeper: ChatKeeper, cp: Checkpoint) -> int:
    """The session and keeper as `cp` took them. Returns how many cache positions came back from
    the old chat's snapshot (the rest of its tokens are pending)."""
    s = keeper.session
    s.cache.reset()
    s.gen.forget()
    s.tokens, s.exchanges, s.trimmed = cp.tokens, cp.exchanges, cp.trimmed
    s.turn_stats, s.settings = cp.turn_stats, cp.settings
    for name, value in cp.keeper.items():
        setattr(keeper, name, value)
    n = 0
    if keeper.store is not None and keeper.chat_id is not None and cp.cache_pos:
        try:
            n, _why = from_snapshot(s, s.tokens, keeper.identity(), keeper.store.snapshot_dir(keeper.chat_id),
                                    cp.cache_pos)
        except Exception:  # the snapshot is only a shortcut: without it the tokens stay pending
            s.cache.reset()
            n = 0
    s.gen.forget()
    keeper.clean_upto = min(keeper.clean_upto, n)  # positions past n will be recomputed: not the snapshot's
    return n
