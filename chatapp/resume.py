"""From the command line's --chat / --resume / --no-store to a ready ChatKeeper.

Shared by headless mode and the TUI so both open stored chats the same way. Flags the user
typed (--temperature ...) override the stored chat's settings; the stored system prompt always
wins, since the chat's tokens were made with it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from chatapp.cli import to_stderr
from chatapp.persist import ChatKeeper
from chatapp.session import Session
from chatapp.store import ChatStore, StoreError
from model.errors import UserError

SAMPLING = ("temperature", "top_k", "top_p", "seed", "max_new_tokens")


def explicit_settings(args: argparse.Namespace) -> dict:
    """The sampling flags given on the command line (those that differ from the defaults)."""
    from chatapp.cli import chat_parser

    defaults = chat_parser().parse_args([])
    return {k: getattr(args, k) for k in SAMPLING if getattr(args, k, None) != getattr(defaults, k, None)}


def open_keeper(session: Session, args: argparse.Namespace, warn: Callable[[str], object] | None = None) -> ChatKeeper:
    """The keeper for this run, with the stored chat already restored when asked for.
    UserError for flags that cannot work together or a chat that does not exist."""
    warn = warn or to_stderr
    chat, resume = getattr(args, "chat", None), getattr(args, "resume", False)
    no_store = getattr(args, "no_store", False)
    if no_store and (chat is not None or resume):
        raise UserError("--no-store cannot be combined with --chat or --resume")
    if (chat is not None or resume) and getattr(args, "system", None) is not None:
        raise UserError("--system cannot change a stored chat's system prompt (use /system after it opens: "
                        "that starts a new chat)")
    if no_store:
        return ChatKeeper(session, None)
    try:
        store = ChatStore()
    except StoreError as e:
        if chat is not None or resume:
            raise
        warn(f"nanochat-tui: warning: chats will not be saved: {e}")
        return ChatKeeper(session, None, why_no_store=str(e))
    keeper = ChatKeeper(session, store)
    chat_id = chat if chat is not None else (store.latest_id() if resume else None)
    if resume and chat_id is None:
        warn("nanochat-tui: no stored chat to resume; starting a new one")
    if chat_id is not None:
        _restored, errors = keeper.open(chat_id)
        for e in errors:
            warn(f"nanochat-tui: warning: {e.message}")
        for k, v in explicit_settings(args).items():
            setattr(session.settings, k, v)
    return keeper
