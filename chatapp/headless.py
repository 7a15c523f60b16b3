"""Headless mode: stdin lines (or JSON objects) in, one JSON object per line out.

stdout carries only JSON events; logs go to stderr. Bad input becomes an error event and
the loop goes on with the next line, so a script never loses its conversation.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import BinaryIO, TextIO

from chatapp.chat.commands import is_text, split_input
from chatapp.chat.events import Error, Event, Prefilling, Progress, Quit, Ready, TextDelta, to_json
from chatapp.store.final_save import final_save
from chatapp.store.keeper import ChatKeeper


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


def run_headless(chat: ChatKeeper, stream: BinaryIO, jsonl: bool = False, out: TextIO = sys.stdout) -> int:
    """Feed each input line to the chat (which stores it as it goes, if it has a store)."""
    emit(Ready(chat.session.stats(), chat.ready_fields()), out)
    for item in read_inputs(stream, jsonl):
        if isinstance(item, Error):
            emit(item, out)
            continue
        kind, text = item
        events = chat.run_command(text) if kind == "command" else chat.send(text)
        for ev in events:
            match ev:
                case TextDelta() | Prefilling() | Progress():
                    continue  # the turn event carries the whole reply and its figures; the trim event the re-prefill's
                case Quit():
                    return farewell(chat, out)
                case _:
                    emit(ev, out)
    return farewell(chat, out)


def farewell(chat: ChatKeeper, out: TextIO) -> int:
    """The last save before the process goes; 1, with one error line, if turns are not on disk."""
    if line := final_save(chat):
        emit(Error(line), out)
        return 1
    return 0
