"""A whole conversation handed in at once (an OpenAI-style message list): the session's history
made equal to it, reusing the longest common prefix of tokens the cache already holds.

`Session.respond_to(messages)` renders every message before the last user message as the
session would have built it turn by turn (the template's opening, each user turn, each reply
in its history form and closed), compares those tokens with what the cache holds, rewinds to
the first difference, and sends the last user message as a normal turn. So a client that sends
back the chat so far, plus one new message, prefills only the new message; a client that
edits an earlier message, drops one or changes the system prompt prefills from that point on:
more prefill, never a wrong cache.

A reply whose text equals the one the session generated at the same place keeps the generated
token ids (re-tokenizing a reply's text can give other ids than the model wrote, which would
cost a re-prefill of the reply for nothing); any other reply is encoded from its text.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from chatapp.chat import whole
from chatapp.chat.commands import is_text
from chatapp.chat.events import Error, Event
from chatapp.chat.exchange import Exchange
from chatapp.chat.session_like import SessionLike
from chatapp.chat.undoable import undoable
from model.chat_formats.whole import Rendered
from model.errors import UserError

ROLES = ("system", "user", "assistant")


@dataclass
class Conversation:
    """A message list taken apart: the system prompt (None: the template's default), the
    (user, reply) pairs before the last message, and the last user message."""

    system: str | None
    pairs: list[tuple[str, str]]
    user: str


def parse_messages(messages: Sequence[dict]) -> Conversation:
    """UserError (one line) unless `messages` is an optional leading system message, then
    user/assistant messages alternating, ending with a user message."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise UserError("messages: give a non-empty list of {role, content} messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise UserError(f"messages[{i}]: expected {{'role': 'system'|'user'|'assistant', 'content': str}}")
    system = None
    rest = list(messages)
    if rest[0]["role"] == "system":
        system, rest = rest[0]["content"], rest[1:]
    for i, m in enumerate(rest):
        want = "user" if i % 2 == 0 else "assistant"
        if m["role"] != want:
            at = i + (system is not None)
            raise UserError(f"messages[{at}]: expected a {want} message here (one optional system message "
                            "first, then user and assistant messages in turn, ending with a user message)")
    if not rest or rest[-1]["role"] != "user":
        raise UserError("messages: the last message must be a user message")
    pairs = [(rest[i]["content"], rest[i + 1]["content"]) for i in range(0, len(rest) - 1, 2)]
    return Conversation(system, pairs, rest[-1]["content"])


def known_reply(s: SessionLike, i: int, user: str, reply: str) -> Exchange | None:
    """The session's exchange i, when it has the same user message and this reply (as generated,
    or its answer without the thinking block, which is what a client shows and sends back)."""
    if i >= len(s.exchanges):
        return None
    ex = s.exchanges[i]
    if ex.user != user or ex.end < 0:
        return None
    # a client's reply is text alone (no token ids, no kinds): the template's own split of ours is what it shows
    return ex if reply in (ex.reply, s.template.split_thinking(ex.reply)[1]) else None


def replayed(s: SessionLike, conv: Conversation) -> tuple[list[int], list[Exchange]]:
    """The token list and exchanges the session would hold after building `conv.pairs` turn by
    turn (the last reply as generated and closed, the earlier ones in their history form)."""
    t = s.template
    system = t.default_system if conv.system is None else conv.system
    closing = t.end_reply()
    tokens = t.start(system)
    exchanges: list[Exchange] = []
    for i, (user, reply) in enumerate(conv.pairs):
        ex = known_reply(s, i, user, reply)
        ids = s.tokens[ex.reply_start:ex.end - len(closing)] if ex else s.tokenizer.encode(reply)
        if i + 1 < len(conv.pairs):
            ids = t.as_history(ids) or ids
        start = len(tokens)
        tokens += t.user_turn(user, "" if i else system)
        reply_start = len(tokens)
        tokens += ids + closing
        text = ex.reply if ex else reply
        calls = list(ex.tool_calls) if ex else []
        exchanges.append(Exchange(user, start, reply_start, len(tokens), text, calls))
    return tokens, exchanges


def adopt_history(s: SessionLike, conv: Conversation) -> None:
    """Make the session's history `conv.pairs` under `conv.system`, keeping the cache's K/V for
    the longest prefix the old and new token lists share (the invariant holds on return: the
    cache holds new[:pos], the rest is pending)."""
    if whole.is_whole(s):
        adopt_whole(s, conv)
        return
    tokens, exchanges = replayed(s, conv)
    keep = whole.common_prefix(s.tokens[:s.cache.seqlen], tokens)
    s.truncate(keep)
    s.settings.system = conv.system
    s.tokens, s.exchanges, s.trimmed = tokens, exchanges, []
    s.turn_stats = [st for st in s.turn_stats if st.turn <= len(exchanges)]


def adopt_whole(s: SessionLike, conv: Conversation) -> None:
    """`adopt_history` for a template rendered whole: the pairs rendered as the template closes
    them, the ids kept for the replies the session wrote."""
    pairs, exchanges = [], []
    for i, (user, reply) in enumerate(conv.pairs):
        ex = known_reply(s, i, user, reply)
        pairs.append((user, ex.reply if ex else reply, whole.reply_ids(s, ex) if ex else None))
        exchanges.append(Exchange(user, -1, -1, -1, ex.reply if ex else reply, list(ex.tool_calls) if ex else []))
    s.settings.system = conv.system
    s.trimmed = []
    rendered = s.template.render(s.system, pairs, None) if pairs else Rendered(s.template.start(s.system), [])
    whole.adopt(s, rendered, exchanges)
    s.turn_stats = [st for st in s.turn_stats if st.turn <= len(exchanges)]


def respond_to(s: SessionLike, messages: list[dict]) -> Iterator[Event]:
    """`Session.respond_to`: the history becomes `messages` (refused whole, nothing moved, if
    they cannot be), then the last user message is sent as a turn."""
    saved = (list(s.tokens), list(s.exchanges), list(s.trimmed), s.settings.system)
    try:
        conv = parse_messages(messages)
        if not conv.user.strip() or not is_text(conv.user):  # refused before anything moves
            s.user_tokens(conv.user.strip(), first=False)
        adopt_history(s, conv)
        new = s.user_tokens(conv.user.strip(), first=not s.exchanges)
    except UserError as e:
        # the cache holds a prefix the old and new token lists share: the old one is valid
        s.tokens, s.exchanges, s.trimmed, s.settings.system = saved
        yield Error(str(e))
        return
    s.cancel_flag.clear()
    yield from undoable(s, s.turn(conv.user.strip(), new))

