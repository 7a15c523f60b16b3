"""The trim policy: which old exchanges leave a full context, and the one re-prefill after it.

Kept tokens move to new positions when older ones leave, and their rotary phases (and every
later layer's K/V, which attended to the dropped tokens) change: the exact way back to the
cache invariant is to re-prefill all that is kept. That costs about as much as the kept
context, so the policy makes it rare: when the next turn does not fit, it drops the oldest
whole exchanges down to a low-water mark (`low_water` x capacity, half by default), and the
chat then grows for half a context before the next trim. `low_water=1` is the old policy:
drop just enough for the turn, so nearly every later turn re-prefills nearly everything.

The re-prefill is chunked and reports `Prefilling` progress; its time and tokens count in the
turn's figures (chat/reply.py). `make_room` is the session's side (a function of it, as in
chat/whole.py); the policy functions above it take token lists and exchanges alone.
"""

from __future__ import annotations

import time
from collections.abc import Generator as Yields
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from chatapp.chat.events import Event, Prefilling, Trimmed
from chatapp.chat.session_like import SessionLike
from model.decode.generate import Generator

REPLY_BUDGET = 64  # room kept for the reply a trim makes way for (capped by max_new_tokens when set)


class Span(Protocol):
    """An exchange as spans of the token list (session.py's `Exchange`)."""

    start: int
    reply_start: int
    end: int


@dataclass
class Cut:
    """What `cut` took out of the token list."""

    trimmed: int          # exchanges (Session.trimmed gains them)
    removed: int          # tokens


def count_to_drop(total: int, starts: Sequence[int], incoming: int, reply: int, capacity: int,
                  low_water: float) -> int:
    """How many of the oldest exchanges to drop, 0 when the new turn and its reply fit.

    `total` is the token list's length, `starts` each exchange's first token (the first one is
    where the system prompt ends). Once a trim is due, the kept conversation must fit the turn
    and a reply, and hold at most `low_water * capacity` tokens, so the next trim is half a
    context of chat away. The system prompt always stays, even when that leaves it alone."""
    want = incoming + min(reply, REPLY_BUDGET)
    if total + want <= capacity or not starts:
        return 0
    mark = min(capacity - want, int(low_water * capacity))
    kept_from = [*starts[1:], total]  # where the kept part begins after dropping n + 1
    for n, begin in enumerate(kept_from):
        if total - (begin - starts[0]) <= mark:
            return n + 1
    return len(starts)


def cut(tokens: list[int], exchanges: Sequence[Span], drop: int, head: list[int]) -> Cut:
    """Take the `drop` oldest exchanges out of `tokens` in place and move the kept spans down.
    `head` is the first kept exchange's user turn as it must read now (nanochat folds the system
    prompt into the first user turn); the dropped spans become -1: text only, out of the context."""
    cut_from = exchanges[0].start
    kept_from = exchanges[drop].start if drop < len(exchanges) else len(tokens)
    removed = kept_from - cut_from
    del tokens[cut_from:kept_from]
    for ex in exchanges[:drop]:
        ex.start = ex.reply_start = ex.end = -1
    kept = exchanges[drop:]
    _shift(kept, -removed)
    if kept:
        first = kept[0]
        tokens[first.start:first.reply_start] = head
        _shift(kept, len(head) - (first.reply_start - first.start), keep_first_start=True)
    return Cut(drop, removed)


def _shift(exchanges: Sequence[Span], delta: int, keep_first_start: bool = False) -> None:
    for j, ex in enumerate(exchanges):
        if not (keep_first_start and j == 0):
            ex.start += delta
        ex.reply_start, ex.end = ex.reply_start + delta, ex.end + delta


def reprefill(gen: Generator, tokens: list[int], reason: str = "trim", model: str = "") -> Iterator[Prefilling]:
    """Prefill `tokens` (all of them pending), a chunk at a time, yielding progress (first at 0,
    so a face shows the row before the wait). The chunks are the Generator's own, so the cache is
    bit-for-bit what one `prefill` would make. Returns the seconds it took, device work included."""
    cache, step = gen.cache, gen.prefill_chunk
    t0 = time.perf_counter()
    yield Prefilling(0, len(tokens), reason, model)
    for i in range(0, len(tokens), step):
        gen.prefill(tokens[i:i + step])
        if cache.device.type == "cuda":
            torch.cuda.synchronize(cache.device)  # the figure is the wait, not the launch
        yield Prefilling(min(i + step, len(tokens)), len(tokens), reason, model)
    return time.perf_counter() - t0


def make_room(s: SessionLike, incoming: int) -> Yields[Event, None, Trimmed | None]:
    """If the new turn and a reply do not fit, drop the oldest whole exchanges down to the
    low-water mark and re-prefill what is kept (the policy and why: above). The
    system prompt stays. Returns the Trimmed event, whose cost the turn's figures include."""
    drop = count_to_drop(len(s.tokens), [ex.start for ex in s.exchanges], incoming,
                              s.settings.max_new_tokens or REPLY_BUDGET, s.cache.capacity, s.settings.low_water)
    if drop == 0:
        return None
    # families without a system role (nanochat) carry it in the first user turn
    head = s.template.user_turn(s.exchanges[drop].user, s.system) if drop < len(s.exchanges) else []
    done = cut(s.tokens, s.exchanges, drop, head)
    s.trimmed += s.exchanges[:drop]  # out of the context, still part of the chat
    s.exchanges = s.exchanges[drop:]
    s.cache.reset()
    s.gen.forget()
    seconds = yield from reprefill(s.gen, s.tokens)
    ev = Trimmed(done.trimmed, done.removed, s.cache.seqlen, s.cache.seqlen, s.cache.capacity,
                 seconds * 1000)
    yield ev
    return ev
