"""Every stored row checked as it is read: a corrupt cell never crashes the app.

A cell that is not what the code expects (bad JSON, a list where an object belongs, text where a
number belongs, nesting past Python's limit, a tool call without its keys) is replaced by a safe
value, and the chat carries a `damage` note naming the cell. Its text is kept wherever it can be
read; token ids from a damaged chat are never used (it re-tokenizes from its text, as a chat from
another tokenizer does). Nothing is written back here: reading never repairs, only the user's
next change saves the chat again (issue 27 item 4).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from chatapp.chat.settings import SETTINGS, parse_settings, settings_text
from chatapp.store.guard import MAX_CELL_BYTES, TOO_BIG
from model.errors import UserError

STOPS = ("", "end", "length", "context", "cancel", "error")  # TurnStats.stop, and '' for "not known"
IN_CONTEXT = [-1]  # a damaged message's ids: "it was in the context", never fed to a model


@dataclass
class Cells:
    """What one row's reading found wrong, in words."""

    where: str
    damage: list[str] = field(default_factory=list)

    def note(self, what: str) -> None:
        self.damage.append(f"{self.where}{what}")

    def too_big(self, raw, name: str) -> bool:
        if raw is TOO_BIG:
            self.note(f"{name} is larger than {MAX_CELL_BYTES >> 20} MiB and was not read")
        return raw is TOO_BIG

    def json(self, raw, name: str, kind: type, default):
        if self.too_big(raw, name):
            return default
        if not isinstance(raw, str | bytes):
            self.note(f"{name} is {type(raw).__name__}, not JSON text")
            return default
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError, UnicodeDecodeError):  # bad JSON, a 5,000-digit number, deep nesting
            self.note(f"{name} is not valid JSON")
            return default
        if not isinstance(value, kind):
            self.note(f"{name} is a JSON {type(value).__name__}, not a {kind.__name__}")
            return default
        return value

    def text(self, raw, name: str, default: str = "") -> str:
        if isinstance(raw, str):
            return raw
        if self.too_big(raw, name):
            return default
        if isinstance(raw, bytes):
            self.note(f"{name} is bytes, not text")
            return raw.decode("utf-8", "replace")
        self.note(f"{name} is {type(raw).__name__}, not text")
        return default if raw is None else str(raw)

    def number(self, raw, name: str, kind: type = int):
        if type(raw) is int or (kind is float and type(raw) is float):
            return raw
        self.note(f"{name} is {type(raw).__name__}, not a number")
        return 0

    def ids(self, raw, name: str) -> list[int] | None:
        """Token ids, or None when the cell is damaged (the chat then re-tokenizes)."""
        value = self.json(raw, name, list, None)
        if value is None:
            return None
        if not all(type(i) is int and 0 <= i < 2**31 for i in value):
            self.note(f"{name} holds entries that are not token ids")
            return None
        return value

    def settings(self, raw) -> dict:
        values = self.json(raw, "settings", dict, {})
        good = {}
        for k, v in values.items():
            if k not in SETTINGS or v is None:
                good[k] = v  # unknown keys are ignored later; None is a valid seed
                continue
            try:
                good.update(parse_settings(settings_text({k: v})))
            except (UserError, ValueError, TypeError):
                self.note(f"setting {k} is {str(v)[:20]!r}")
        return good

    def stop(self, raw, name: str) -> str:
        """A reply's stop reason; anything else is not known ('')."""
        if raw in STOPS or self.too_big(raw, name):
            return raw if raw in STOPS else ""
        self.note(f"{name} is {str(raw)[:20]!r}, not a stop reason")
        return ""

    def tool_calls(self, raw, name: str) -> list[dict]:
        calls = self.json(raw, name, list, [])
        ok = [c for c in calls if isinstance(c, dict) and set(c) == {"expr", "result"}
              and isinstance(c["expr"], str) and isinstance(c["result"], str | None)]
        if len(ok) != len(calls):
            self.note(f"{name} holds {len(calls) - len(ok)} malformed tool call(s)")
        return ok


def chat_row(row: tuple, msg_rows: list[tuple], ChatRecord, StoredMessage):  # noqa: N803 (database's classes)
    """ChatRecord from the chats row and its message rows, whatever their cells hold. The classes
    come from database.py, which imports this module (and no module imports back)."""
    (cid, title, model, mfp, tfp, settings, system, prefix, cache_seqlens, created, updated) = row
    c = Cells("")
    data = ChatRecord(c.text(title, "title", "untitled") or "untitled", c.text(model, "model"),
                    c.text(mfp, "model fingerprint"), c.text(tfp, "tokenizer fingerprint"), c.settings(settings),
                    c.text(system, "system prompt"), c.ids(prefix, "prefix tokens"),
                    c.number(cache_seqlens, "cache_pos"), [], cid, c.number(created, "created", float),
                    c.number(updated, "updated", float))
    token_damage = data.prefix_tokens is None
    for seq, (role, content, token_ids, tool_calls, stop) in enumerate(msg_rows):
        m = Cells(f"message {seq + 1}: ")
        ids = m.ids(token_ids, "token_ids")
        token_damage |= ids is None
        data.messages.append(StoredMessage(role if role in ("user", "assistant") else "user",
                                           m.text(content, "content"), IN_CONTEXT if ids is None else ids,
                                           m.tool_calls(tool_calls, "tool_calls"), m.stop(stop, "stop")))
        c.damage += m.damage
    if token_damage:  # ids that cannot be trusted: the chat comes back from its text
        data.prefix_tokens, data.tokenizer_fingerprint = [], ""
        for msg in data.messages:
            msg.token_ids = IN_CONTEXT if msg.token_ids else []
    data.damage = c.damage
    return data


# A chat's cells as SQL sees them, for the chats list: cheap (no Python JSON parse), and what
# it misses (a list of text where ids belong) is found when the chat is opened.
DAMAGED_SQL = """(typeof(c.title) != 'text' OR typeof(c.cache_pos) != 'integer'
 OR NOT json_valid(c.settings) OR NOT json_valid(c.prefix_tokens)
 OR EXISTS (SELECT 1 FROM messages d WHERE d.chat_id = c.id AND (typeof(d.content) != 'text'
   OR NOT json_valid(d.token_ids) OR NOT json_valid(d.tool_calls)
   OR (CASE WHEN json_valid(d.token_ids) THEN json_type(d.token_ids) ELSE '' END) != 'array')))"""
