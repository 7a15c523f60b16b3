"""The messages of a chat-completions request, made into what `Session.respond_to` takes.

OpenAI's API is looser than a chat template: content may be a list of text parts, the system
prompt may come as a "developer" message, and two messages of one role may follow each other.
This evens that out, or says in one line (a 400) why a request is not a conversation.
"""

from __future__ import annotations

from chatapp.chat.commands import is_text

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


def normalize(messages: object) -> list[dict]:
    """The messages as `Session.respond_to` takes them: an optional system message, then user
    and assistant messages in turn, ending with a user message, each content a string.
    Consecutive messages of one role are joined by a blank line (clients send two user
    messages in a row, or several system ones); a system message may only open the chat."""
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
    body = turns[1:] if turns[0][0] == "system" else turns
    if not body or body[-1][0] != "user":
        raise BadMessages("the last message must be a user message")
    if body[0][0] != "user":
        raise BadMessages("the conversation must start with a user message (after any system message)")
    return [{"role": r, "content": t} for r, t in turns]
