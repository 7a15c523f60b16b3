"""A turn that cannot lose the chat: if the model fails mid-turn (NaN logits from bad weights,
out of memory), the chat is put back as it was before it, with one line saying why."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from chatapp.chat.events import Error, Event
from chatapp.chat.session_like import SessionLike
from model.errors import UserError, where


def undoable(s: SessionLike, turn: Iterator[Event]) -> Iterator[Event]:
    """Run `turn`; on a failure restore the tokens, exchanges and turn figures and report it: the
    user's message and the conversation stay intact. The cache keeps only the K/V still valid
    for the restored tokens, so the invariant holds."""
    saved = (list(s.tokens), [replace(ex, tool_calls=list(ex.tool_calls)) for ex in s.exchanges],
             list(s.trimmed), list(s.turn_stats))
    try:
        yield from turn
    except Exception as e:  # a model failure must not lose the chat
        held = s.tokens[:s.cache.seqlen]  # what the cache holds K/V for, at the failure
        s.tokens, s.exchanges, s.trimmed, s.turn_stats = saved
        valid = next((i for i, (a, b) in enumerate(zip(s.tokens, held, strict=False)) if a != b),
                     min(len(s.tokens), len(held)))
        if s.cache.seqlen > valid:
            s.cache.rewind(valid)
        s.gen.forget()
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        yield s.state("undone")
        if isinstance(e, UserError):   # the chat template refused the chat (chat_formats/whole.py)
            yield Error(f"{reason}; the chat is as it was before this message")
            return
        yield Error(f"the model failed during this turn ({type(e).__name__} in {where(e)}: {reason}); "
                    f"the chat is as it was before it")
