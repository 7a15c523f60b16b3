"""Headless mode: stdin lines (or JSON objects, or with --multiline messages of several lines) in,
one JSON object per line out.

It talks to any keeper (chatapp/keeper/base.py): the in-process one, or --backend's, which must
not import torch, so nothing here does.

stdout carries only JSON events; logs go to stderr. Bad input becomes an error event and
the loop goes on with the next line, so a script never loses its conversation.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import BinaryIO, TextIO

from chatapp.chat.commands import Command, is_text, parse_command, parse_input
from chatapp.chat.events import Error, Event, Prefilling, Progress, Quit, Ready, TextDelta, to_json
from chatapp.keeper.base import Keeper
from chatapp.keeper.final_save import final_save
from model.errors import UserError, unexpected
from model.escapes import json_controls

END = "."  # --multiline: a line holding only this ends a message (as in SMTP and mail(1))


def decode(raw: bytes, n: int) -> str:
    """Line `n` of stdin without its line ending. UnicodeDecodeError for bytes that are not UTF-8."""
    return raw.decode("utf-8-sig" if n == 1 else "utf-8").rstrip("\r\n")  # -sig: a BOM is not text


def read_inputs(stream: BinaryIO, jsonl: bool) -> Iterator[Command | str | Error]:
    """Yield each line parsed: a message's text, a Command, or an Error for a bad line (a
    malformed command included, in the words the TUI shows)."""
    for n, raw in enumerate(stream, 1):
        try:
            line = decode(raw, n)
        except UnicodeDecodeError as e:
            yield Error(f"line {n}: not valid UTF-8 ({e.reason} at byte {e.start}); line skipped")
            continue
        if not line.strip():
            continue
        if not jsonl:
            yield parsed(parse_input, line)
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            yield Error(f"line {n}: not valid JSON: {json_problem(e)}; line skipped")
            continue
        except (RecursionError, ValueError):  # nested past Python's limit; an integer of 4,300+ digits
            yield Error(f"line {n}: JSON too deeply nested or with too large a number; line skipped")
            continue
        kind = next((k for k in ("user", "command") if isinstance(obj, dict) and isinstance(obj.get(k), str)), None)
        if kind is None:
            yield Error(f'line {n}: expected {{"user": "..."}} or {{"command": "/..."}}; line skipped')
            continue
        if not is_text(obj[kind]):  # a JSON escape can name a lone surrogate, which no text holds
            yield Error(f"line {n}: not valid Unicode (a lone surrogate); line skipped")
            continue
        yield parsed(parse_command, obj[kind]) if kind == "command" else obj[kind]


def read_messages(stream: BinaryIO) -> Iterator[Command | str | Error]:
    """--multiline: a message is every line up to one holding only END (spaces around it allowed)
    or the end of input, joined with newlines, its blank first and last lines dropped; so a piped
    file with no END line is one message. Each is parsed as the TUI's input box parses what is
    typed into it: one starting with / is a command. A message with a line that is not UTF-8 is
    skipped whole, with one error naming that line: half a prompt is not sent."""
    lines: list[str] = []
    bad: Error | None = None
    for n, raw in enumerate(stream, 1):
        try:
            line = decode(raw, n)
        except UnicodeDecodeError as e:
            bad = bad or Error(f"line {n}: not valid UTF-8 ({e.reason} at byte {e.start}); its message skipped")
            continue
        if line.strip() != END:
            lines.append(line)
            continue
        if item := message(lines, bad):
            yield item
        lines, bad = [], None
    if item := message(lines, bad):
        yield item


def message(lines: list[str], bad: Error | None) -> Command | str | Error | None:
    """One --multiline message (None: only blank lines)."""
    if bad is not None:
        return bad
    while lines and not lines[-1].strip():
        lines.pop()
    start = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    return parsed(parse_input, "\n".join(lines[start:])) if lines[start:] else None


def json_problem(e: json.JSONDecodeError) -> str:
    """The decoder's message with its place: its `msg` alone is cut mid-sentence ("Unterminated
    string starting at", "Expecting value"), the place being in `str(e)` only."""
    msg = e.msg[0].lower() + e.msg[1:]
    return f"{msg}{'' if msg.endswith(' at') else ' at'} column {e.colno}"


def parsed(parse: Callable[[str], Command | str], text: str) -> Command | str | Error:
    try:
        return parse(text)
    except UserError as e:
        return Error(str(e))


def emit(ev: Event, out: TextIO) -> None:
    out.write(json_controls(json.dumps(to_json(ev), ensure_ascii=False)) + "\n")
    out.flush()


def run_headless(keeper: Keeper, stream: BinaryIO, jsonl: bool = False, out: TextIO = sys.stdout,
                 multiline: bool = False) -> int:
    """Feed each input line (--multiline: each message) to the chat (which stores it as it goes,
    if it has a store)."""
    emit(Ready(keeper.session.stats(), keeper.ready_fields()), out)
    for item in read_messages(stream) if multiline else read_inputs(stream, jsonl):
        if isinstance(item, Error):
            emit(item, out)
            continue
        if play(keeper.run(item) if isinstance(item, Command) else keeper.send(item), out):
            return farewell(keeper, out)
    return farewell(keeper, out)


def play(events: Iterator[Event], out: TextIO) -> bool:
    """Emit one input's events; True when they ask to quit. An exception nobody caught below
    (the session puts the chat back itself: chat/undoable.py) is one error line, and the next
    input is read."""
    try:
        for ev in events:
            match ev:
                case TextDelta() | Prefilling() | Progress():
                    continue  # the turn event carries the whole reply and its figures; the trim event the re-prefill's
                case Quit():
                    return True
                case _:
                    emit(ev, out)
    except Exception as e:
        emit(Error(unexpected(e)), out)
    return False


def farewell(keeper: Keeper, out: TextIO) -> int:
    """The last save before the process goes; 1, with one error line, if turns are not on disk."""
    if line := final_save(keeper):
        emit(Error(line), out)
        return 1
    return 0
