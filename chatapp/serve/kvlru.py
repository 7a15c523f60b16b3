"""A small LRU of KV snapshots, so a few conversations that take turns on the one engine each
resume without a re-prefill.

The live cache holds one conversation. When a request continues another one that a snapshot
holds a longer start of, the live conversation is copied out (its K/V up to `cache.seqlen`, its
token list and exchanges) and the snapshot is copied in; `Session.respond_to` then finds the
longest common prefix as usual. Conversations are matched by their messages' text (the system
prompt, then whole user/assistant pairs), which needs no rendering; the token-level match is
respond_to's. The copies stay on the cache's device: a restore is one tensor copy, timed.

Every conversation carries the isolation key of the requests that built it (the API key among
several, and `cache_salt`: `ChatRequest.isolation`). A request never reuses a cache built under
another key, the live one or a snapshot: before it runs, a live cache of another key is stashed
under its own key and emptied. Otherwise `cached_tokens` would tell one client how much of its
prompt another client's prompt shares, token by token (issue 45: a PIN in a system prompt read
back by guessing).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import torch

from chatapp.chat.session import Exchange, Session

Isolation = tuple[int, str | None]  # (which API key, cache_salt): ChatRequest.isolation
Key = tuple[Isolation, str | None, tuple[tuple[str, str], ...]]  # (isolation, system, ((user, reply), ...))


def split(messages: list[dict]) -> tuple[str | None, list[tuple[str, str]], str]:
    """(system, (user, reply) pairs, last user message) of normalized messages (messages.py)."""
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    rest = [m["content"] for m in messages[system is not None:]]
    return system, list(zip(rest[0:-1:2], rest[1::2], strict=True)), rest[-1]


def request_key(messages: list[dict], isolation: Isolation) -> Key:
    """What of the conversation a request's cache could already hold: all but its last message."""
    system, pairs, _user = split(messages)
    return isolation, system, tuple(pairs)


def score(have: Key, want: Key) -> int:
    """How much of `want` a conversation `have` starts with: 0 nothing (or another isolation
    key's), 1 the system prompt, then one more per leading exchange."""
    if have[:2] != want[:2]:
        return 0
    n = 0
    for a, b in zip(have[2], want[2], strict=False):
        if a != b:
            break
        n += 1
    return 1 + n


def whole(key: Key) -> int:
    """The score of a conversation against itself: all of it."""
    return 1 + len(key[2])


@dataclass
class Snapshot:
    key: Key
    tokens: list[int]
    exchanges: list[Exchange]
    system: str | None
    cache_seqlens: int   # positions of K/V copied
    k: torch.Tensor
    v: torch.Tensor
    state: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, *self.state.values()))


@dataclass
class Swap:
    """What `prepare` did: restored `tokens` positions from a snapshot in `ms`, or nothing."""

    tokens: int = 0
    ms: float = 0.0


class SnapshotLRU:
    def __init__(self, slots: int = 3, budget_bytes: int = 2 << 30):
        self.slots, self.budget = slots, budget_bytes
        self.snaps: OrderedDict[int, Snapshot] = OrderedDict()  # oldest first
        self.live: Key | None = None     # the conversation the live cache holds, as its messages
        self.owner: Isolation = (0, None)  # whose requests built what the live cache holds (kept past a failure)
        self.next_id = 0

    def remember(self, messages: list[dict], reply: str) -> None:
        """After a request: the live cache holds its conversation plus the reply it sent."""
        system, pairs, user = split(messages)
        self.live = (self.owner, system, (*pairs, (user, reply)))

    def forget_live(self) -> None:
        self.live = None

    def prepare(self, s: Session, messages: list[dict], isolation: Isolation) -> Swap:
        """Before a request: empty a live cache another isolation key built (stashing it), then
        swap in the snapshot that holds more of its conversation than the live cache does
        (stashing the live one), if there is one."""
        if isolation != self.owner:
            self.stash(s)
            s.adopt([], [])  # nothing another key's requests left in the cache may be reused
            self.live, self.owner = None, isolation
        want = request_key(messages, isolation)
        live = score(self.live, want) if self.live is not None else 0
        best = max(self.snaps.items(), key=lambda kv: score(kv[1].key, want), default=None)
        if best is not None and score(best[1].key, want) > live:
            del self.snaps[best[0]]
            self.stash(s)
            return self.restore(s, best[1])
        if self.live is not None and live < whole(self.live):
            self.stash(s)  # the request does not continue the live chat: keep a copy before it is rewound
        return Swap()

    def stash(self, s: Session) -> None:
        """Copy the live conversation out (nothing to keep when the cache is empty)."""
        c = s.cache
        if self.live is None or c.seqlen == 0 or self.slots == 0:
            return
        exchanges = [replace(ex, tool_calls=list(ex.tool_calls)) for ex in s.exchanges]  # the session mutates its own
        snap = Snapshot(self.live, list(s.tokens), exchanges, s.settings.system, c.seqlen,
                        c.k_cache[:, :, :c.seqlen].clone(), c.v_cache[:, :, :c.seqlen].clone(),
                        {n: b[:, :c.seqlen].clone() for n, b in c.state.items()})
        for i in [i for i, sn in self.snaps.items() if score(sn.key, snap.key) == whole(sn.key)]:
            del self.snaps[i]  # an older copy of the same chat: this one holds all of it
        self.snaps[self.next_id] = snap
        self.next_id += 1
        while self.snaps and (len(self.snaps) > self.slots or self.bytes > self.budget):
            self.snaps.popitem(last=False)
        self.live = None

    def restore(self, s: Session, snap: Snapshot) -> Swap:
        t0 = time.perf_counter()
        s.adopt(snap.tokens, snap.exchanges)  # empties the cache: every token pending
        s.settings.system = snap.system
        c, n = s.cache, snap.cache_seqlens
        c.k_cache[:, :, :n].copy_(snap.k)
        c.v_cache[:, :, :n].copy_(snap.v)
        for name, b in c.state.items():
            b[:, :n].copy_(snap.state[name])
        c.advance(n)
        if c.device.type == "cuda":
            torch.cuda.synchronize(c.device)  # so the time is the copy's, not its launch's
        self.live = snap.key
        return Swap(n, (time.perf_counter() - t0) * 1000)

    @property
    def bytes(self) -> int:
        return sum(sn.nbytes for sn in self.snaps.values())
