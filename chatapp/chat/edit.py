"""/edit N TEXT: rewind the chat to the start of message N and send TEXT in its place.

A rewind, not a re-render: every token before message N is already in the cache and stays
valid (K/V at a position depends only on the tokens up to it), so the cut is
`KVCache.rewind` (O(1), no tensor touched) and the turn prefills only the new message. Its
`TurnStats.cached_before` is message N's start.

The invariant holds through it: `tokens[:start]` is the rendering of the exchanges before N,
and those keep the tokens they have. A reply before N already took its history form (Qwen3
drops its thinking) when the next message came, and that form is what the official template
renders again, so the next turn changes nothing there. When N is the first exchange in the
context, the new message carries the system prompt for families that fold it in (nanochat),
as the first message of a chat does.

N counts the exchanges as shown, trimmed ones too (`Session.turns`). One a trim took out of
the context is refused rather than re-prefilled: its tokens are gone, and editing it would
re-prefill the whole kept history, which /edit promises not to do. The keeper
(chatapp/keeper/keeper.py) keeps the old continuation as a branch before calling `rewind_and_send`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from chatapp.chat.events import Event
from chatapp.chat.undoable import undoable
from model.errors import UserError

if TYPE_CHECKING:  # the session imports nothing from here: no cycle, only the type
    from chatapp.chat.session import Session


def parse_edit(arg: str) -> tuple[int, str]:
    """`3 new text` -> (3, "new text"); UserError otherwise. The text may span lines."""
    number, text = (re.split(r"\s+", arg.strip(), maxsplit=1) + [""])[:2]
    if not (number.isascii() and number.isdigit()):
        raise UserError(f"/edit: N is the number of the message to edit (as shown), got {number!r}: /edit N TEXT")
    if not text.strip():
        raise UserError("/edit: give the new text after the number: /edit N TEXT")
    return int(number), text.strip()


def exchange_index(session: Session, n: int) -> int:
    """Where message `n` (1-based, trimmed ones counted) is in `session.exchanges`; UserError
    when there is no such message in the context."""
    trimmed, total = len(session.trimmed), session.turns
    if total == 0:
        raise UserError("/edit: no message to edit yet")
    if not 1 <= n <= total:
        raise UserError(f"/edit: no message {n}; this chat has messages 1-{total}")
    if n <= trimmed:
        raise UserError(f"/edit: message {n} was trimmed out of the context, so it cannot be edited in place; "
                        f"messages {trimmed + 1}-{total} can")
    return n - trimmed - 1


def check_edit(session: Session, arg: str) -> tuple[int, str, list[int]]:
    """(N, TEXT, the new message's tokens) for `/edit N TEXT`, or UserError with nothing changed."""
    n, text = parse_edit(arg)
    i = exchange_index(session, n)
    new = session.user_tokens(text, first=i == 0)
    return n, text, new


def rewind_and_send(session: Session, n: int, text: str, new: list[int]) -> Iterator[Event]:
    """Cut the chat back to the start of message `n` and send `text` there. A model failure
    puts the whole chat back as it was before the edit (chat/undoable.py)."""
    i = exchange_index(session, n)

    def turn() -> Iterator[Event]:
        start = session.exchanges[i].start
        session.truncate(start)
        del session.exchanges[i:]
        session.forget_turn_stats()
        yield session.state("edit", f"rewound to message {n}: {session.cache.seqlen} tokens stay cached")
        yield from session.turn(text, new)
    yield from undoable(session, turn())
