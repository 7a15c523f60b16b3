"""Headless mode: stdin lines (or JSON objects) in, one JSON object per line out.

stdout carries only JSON events; logs go to stderr. Bad input becomes an error event and
the loop goes on with the next line, so a script never loses its conversation.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO, TextIO

from chatapp.commands import is_text, split_input
from chatapp.events import Error, Event, Quit, TextDelta, to_json
from chatapp.session import Session

if TYPE_CHECKING:
    from chatapp.persist import ChatKeeper


def read_inputs(stream: BinaryIO, jsonl: bool) -> Iterator[tuple[str, str] | Error]:
    """Yield ("user", text) / ("command", text) pairs, or an Error for a bad line."""
    for n, raw in enumerate(stream, 1):
        try:
            line = raw.decode("utf-8-sig" if n == 1 else "utf-8").rstrip("\r\n")  # -sig: a BOM is not text
        except UnicodeDecodeError as e:
            yield Error(f"line {n}: not valid UTF-8 ({e.reason} at byte {e.start}); line skipped")
            continue
        if not line.strip():
            continue
        if not jsonl:
            yield split_input(line)
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            yield Error(f"line {n}: not valid JSON ({e.msg})")
            continue
        except (RecursionError, ValueError):  # nested past Python's limit; an integer of 4,300+ digits
            yield Error(f"line {n}: JSON too deeply nested or with too large a number; line skipped")
            continue
        kind = next((k for k in ("user", "command") if isinstance(obj, dict) and isinstance(obj.get(k), str)), None)
        if kind is None:
            yield Error(f'line {n}: expected {{"user": "..."}} or {{"command": "/..."}}')
            continue
        if not is_text(obj[kind]):  # a JSON escape can name a lone surrogate, which no text holds
            yield Error(f"line {n}: not valid Unicode (a lone surrogate); line skipped")
            continue
        yield (kind, obj[kind])


def emit(ev: Event, out: TextIO) -> None:
    out.write(json.dumps(to_json(ev), ensure_ascii=False) + "\n")
    out.flush()


def run_headless(session: Session, stream: BinaryIO, jsonl: bool = False, out: TextIO = sys.stdout,
                 keeper: ChatKeeper | None = None) -> int:
    """`keeper` (chatapp/persist.py) stores the chat as it goes and serves /save, /load, /export."""
    face = keeper or session
    emit_ready(session, out, keeper.ready_fields() if keeper else {})
    for item in read_inputs(stream, jsonl):
        if isinstance(item, Error):
            emit(item, out)
            continue
        kind, text = item
        events = face.run_command(text) if kind == "command" else face.send(text)
        for ev in events:
            if isinstance(ev, TextDelta):
                continue  # the turn event carries the whole reply
            if isinstance(ev, Quit):
                return 0
            emit(ev, out)
    return 0


def emit_ready(session: Session, out: TextIO, extra: dict | None = None) -> None:
    out.write(json.dumps({"event": "ready", **session.stats(), **(extra or {})}) + "\n")
    out.flush()
