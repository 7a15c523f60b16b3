"""Turns for a model whose template is rendered whole (model/chat_formats/whole.py).

Each turn renders the whole conversation, keeps the cache for the longest token prefix the new
rendering shares with what it holds, and makes the rendering the token list: the invariant
(the cache holds tokens[:pos], tokens equal the template over the transcript) holds after
every step. Replies the model wrote keep their ids where the template copies them in unchanged.

Exchange spans here: `reply_start`/`end` are the reply's own ids (no closing tokens: those are
template text, in the next span), `start` is where the previous reply ended. A reply the template
rewrites (its text rendered, not its ids) has no span of its own (-1).
"""

from __future__ import annotations

from collections.abc import Generator as Yields
from collections.abc import Sequence

from chatapp.chat import trim
from chatapp.chat.events import Event, Trimmed
from chatapp.chat.exchange import Exchange
from chatapp.chat.session_like import SessionLike
from model.chat_formats.whole import Pair, Rendered
from model.errors import UserError


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def is_whole(s: SessionLike) -> bool:
    return getattr(s.template, "whole", False)


def reply_ids(s: SessionLike, ex: Exchange) -> list[int] | None:
    return s.tokens[ex.reply_start:ex.end] if 0 <= ex.reply_start <= ex.end <= len(s.tokens) else None


def pairs_of(s: SessionLike, exchanges: list[Exchange]) -> list[Pair]:
    return [(ex.user, ex.reply, reply_ids(s, ex)) for ex in exchanges]


def adopt(s: SessionLike, r: Rendered, exchanges: list[Exchange]) -> None:
    """Make `r` the token list, keeping the cache for the prefix it shares with the old one,
    and give `exchanges` (those r was rendered from) their spans in it."""
    keep = common_prefix(s.tokens[:s.cache.seqlen], r.tokens)
    s.truncate(keep)
    s.tokens = list(r.tokens)
    place(s.template, s.system, r, exchanges)
    s.exchanges = list(exchanges)


def place(template, system: str, r: Rendered, exchanges: list[Exchange]) -> None:
    """Give `exchanges` (those `r` was rendered from) their spans in r.tokens."""
    prev = len(template.start(system)) if exchanges else 0
    for ex, (a, b) in zip(exchanges, r.replies, strict=True):
        ex.start, ex.reply_start, ex.end = min(prev, len(r.tokens)), a, b
        prev = b if b >= 0 else prev


def rendered(template, system: str, pairs: list[Pair], exchanges: list[Exchange]) -> list[int]:
    """The closed chat's tokens for `pairs`, `exchanges` placed in them (a reopened chat)."""
    r = template.render(system, pairs, None) if pairs else Rendered(template.start(system), [])
    place(template, system, r, exchanges)
    return r.tokens


def sync(s: SessionLike, user: str | None) -> None:
    """The token list for the exchanges in the context and, with `user`, the next message up to
    where the model answers it."""
    exchanges = list(s.exchanges)
    r = s.template.render(s.system, pairs_of(s, exchanges), user)
    if user is not None and not r.tokens:   # refused before the cache is cut to the (empty) common prefix
        raise UserError("the model's chat template renders this chat as no tokens; nothing was sent")
    adopt(s, r, exchanges)


def close(s: SessionLike, ex: Exchange, generated: list[int]) -> None:
    """The reply just written (`generated`) closed as the template closes replies."""
    ex.reply_start, ex.end = len(s.tokens) - len(generated), len(s.tokens)
    sync(s, None)


def make_room(s: SessionLike, user: str) -> Yields[Event, None, Trimmed | None]:
    """When the next message and a reply do not fit, drop the oldest exchanges (to the low-water
    mark, as chat/trim.py does for every format) and re-prefill what is kept."""
    budget = min(s.settings.max_new_tokens or trim.REPLY_BUDGET, trim.REPLY_BUDGET)
    render = s.template.render(s.system, pairs_of(s, s.exchanges), user)
    if len(render.tokens) + budget <= s.cache.capacity or not s.exchanges:
        return None
    mark = min(s.cache.capacity - budget, int(s.settings.low_water * s.cache.capacity))
    before, trimmed = len(s.tokens), 0
    while s.exchanges and len(render.tokens) > mark:
        s.trimmed.append(s.exchanges.pop(0))
        trimmed += 1
        render = s.template.render(s.system, pairs_of(s, s.exchanges), user)
    s.cache.reset()
    s.gen.forget()
    kept = list(s.exchanges)
    adopt(s, s.template.render(s.system, pairs_of(s, kept), None) if kept else
          Rendered(s.template.start(s.system), []), kept)
    for ex in s.trimmed[-trimmed:]:
        ex.start = ex.reply_start = ex.end = -1
    seconds = yield from trim.reprefill(s.gen, s.tokens)
    ev = Trimmed(trimmed, max(before - len(s.tokens), 0), s.cache.seqlen, s.cache.seqlen, s.cache.capacity,
                 seconds * 1000)
    yield ev
    return ev
