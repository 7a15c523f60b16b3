"""A whole conversation in, one reply out: the server's turn (chatapp/serve/).

An OpenAI-style client resends the growing conversation with every request. `respond_to`
renders it with the model's chat format, keeps the longest common token prefix with what the
cache already holds, prefills only the rest and decodes, exactly like a TUI turn. Replies the
session generated itself keep their own token ids (re-encoding a reply's text can split it
differently), so a client that sends back what it got reuses everything. `Session.respond_to` runs the turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chatapp.chat.commands import is_text
from chatapp.chat.events import ToolCall

ROLES = ("system", "developer", "user", "assistant")


class BadMessages(ValueError):
    """The messages are not a conversation this format can render (400 for a server)."""


def message_text(m: object, i: int) -> tuple[str, str]:
    """(role, text) of one OpenAI message; content may be a string or a list of text parts."""
    if not isinstance(m, dict):
        raise BadMessages(f"messages[{i}] must be an object with role and content")
    role, content = m.get("role"), m.get("content")
    if role not in ROLES:
        raise BadMessages(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
    if isinstance(content, list):
        parts = []
        for j, p in enumerate(content):
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise BadMessages(f"messages[{i}].content[{j}]: only text parts are supported")
            parts.append(p["text"])
        content = "".join(parts)
    if content is None and role == "assistant":
        content = ""
    if not isinstance(content, str):
        raise BadMessages(f"messages[{i}].content must be a string or a list of text parts")
    if not is_text(content):
        raise BadMessages(f"messages[{i}].content is not valid Unicode (a lone surrogate)")
    return ("system" if role == "developer" else role), content


def split_conversation(messages: list) -> tuple[str | None, list[tuple[str, str]], str]:
    """(system or None, [(user, reply), ...], the last user message). Consecutive messages of one
    role are joined by a blank line; a system message may only open the conversation."""
    if not isinstance(messages, list) or not messages:
        raise BadMessages("messages must be a non-empty list")
    turns: list[list[str]] = []  # [role, text]
    for i, m in enumerate(messages):
        role, text = message_text(m, i)
        if role == "system" and any(r != "system" for r, _ in turns):
            raise BadMessages(f"messages[{i}]: a system message may only come first")
        if turns and turns[-1][0] == role:
            turns[-1][1] += "\n\n" + text
        else:
            turns.append([role, text])
    system = turns.pop(0)[1] if turns[0][0] == "system" else None
    if not turns or turns[-1][0] != "user":
        raise BadMessages("the last message must be a user message")
    if turns[0][0] != "user":
        raise BadMessages("the conversation must start with a user message (after any system message)")
    pairs = [(turns[i][1], turns[i + 1][1]) for i in range(0, len(turns) - 1, 2)]
    return system, pairs, turns[-1][1]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@dataclass
class Span:
    """An exchange of the rendered conversation (the session makes its `Exchange`s of these)."""

    user: str
    start: int
    reply_start: int
    end: int = -1
    reply: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


def render(s: Any, system: str, pairs: list[tuple[str, str]], user: str) -> tuple[list[int], list[Span]]:
    """The token list and exchanges of the conversation for session `s`, built turn by turn as
    the session builds its own. A reply equal to the session's own reply at that place (with
    the same history before it) keeps the ids the model generated."""
    t = s.template
    tokens = t.start(system)
    same = tokens == s.tokens[:len(tokens)]
    out: list[Span] = []
    closing = t.end_reply()
    for i, (u, a) in enumerate(pairs):
        start = len(tokens)
        tokens += t.user_turn(u, "" if i else system)
        reply_start = len(tokens)
        ex = s.exchanges[i] if i < len(s.exchanges) else None
        same = same and ex is not None and ex.user == u and ex.start == start and ex.reply_start == reply_start \
            and a in (ex.reply, t.split_thinking(ex.reply)[1])
        ids = s.tokens[ex.reply_start:ex.end - len(closing)] if same else s.tok.encode(a)
        if same and a != ex.reply:  # the client sent back the answer without its thinking block
            ids = s.tok.encode(t.history_text(ex.reply))
        tokens += (t.as_history(ids) or ids) + closing
        out.append(Span(u, start, reply_start, len(tokens), a if not same else ex.reply,
                            list(ex.tool_calls) if same else []))
    start = len(tokens)
    tokens += t.user_turn(user, "" if pairs else system)
    out.append(Span(user, start, len(tokens)))
    return tokens, out
