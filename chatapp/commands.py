"""Parsing `/commands`, with one-line errors for anything unknown or malformed."""

from __future__ import annotations

from dataclasses import dataclass

from model.errors import UserError

COMMANDS = {
    "/reset": "start a new chat: empty the cache and the transcript",
    "/retry": "rewind to before the last reply and generate it again",
    "/undo": "remove the last exchange",
    "/system": "/system TEXT: set the system prompt (starts a new chat)",
    "/set": "/set temperature=0.7 top_k=50 top_p=0.9 seed=1 max_new_tokens=256",
    "/stats": "show the cache and the last turn's figures",
    "/help": "list commands and keys",
    "/save": "/save [TITLE]: save this chat now (chats are also saved after every turn)",
    "/load": "/load [ID]: open a stored chat (default: the last one)",
    "/export": "/export [PATH]: write this chat as Markdown",
    "/quit": "leave",
}
STORE_COMMANDS = ("/save", "/load", "/export")

# name -> (type, check, description of valid values)
SETTINGS = {
    "temperature": (float, lambda v: 0 <= v <= 5, "a number from 0 to 5"),
    "top_k": (int, lambda v: v >= 0, "an integer >= 0 (0 = off)"),
    "top_p": (float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "seed": (int, lambda v: 0 <= v < 2**64, "an integer from 0 to 2**64 - 1"),
    "max_new_tokens": (int, lambda v: v >= 1, "an integer >= 1"),
}


@dataclass
class Command:
    name: str
    arg: str = ""


def is_text(s: str) -> bool:
    """False for a str no file or terminal can hold: a lone surrogate (from a JSON escape or a
    paste) cannot be encoded, so the store, the export and the screen would all fail on it."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_command(line: str) -> Command:
    if not is_text(line):
        raise UserError("command is not valid Unicode (it holds a lone surrogate)")
    name, _, arg = line.strip().partition(" ")
    name = name.lower()
    if name not in COMMANDS:
        raise UserError(f"unknown command {name}; try /help")
    arg = arg.strip()
    if name == "/system" and not arg:
        raise UserError("/system needs the new system prompt: /system TEXT")
    if name in ("/reset", "/retry", "/undo", "/stats", "/help", "/quit") and arg:
        raise UserError(f"{name} takes no argument")
    return Command(name, arg)


def parse_settings(arg: str) -> dict:
    """`temperature=0.7 top_k=50` -> {"temperature": 0.7, "top_k": 50}, or a UserError."""
    if not arg:
        raise UserError("usage: " + COMMANDS["/set"])
    out = {}
    for pair in arg.split():
        key, eq, raw = pair.partition("=")
        if key not in SETTINGS:
            raise UserError(f"unknown setting {key!r}; settings: {', '.join(SETTINGS)}")
        typ, ok, valid = SETTINGS[key]
        try:
            value = typ(raw) if eq else None
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise UserError(f"{key} must be {valid}, got {raw!r}")
        out[key] = value
    return out


def parse_chat_id(arg: str) -> int:
    """`/load 12` -> 12; ValueError otherwise. ASCII digits only: int() also takes "1_0" and
    digits of other scripts, which nobody means as a chat id."""
    if not (arg.isascii() and arg.isdigit()):
        raise ValueError(arg)
    return int(arg)


def split_input(text: str) -> tuple[str, str]:
    """("command", line) or ("user", message). A message that starts with "/" is sent by
    doubling the slash: "//usr/bin/env crashes" sends "/usr/bin/env crashes"."""
    s = text.lstrip()
    if s.startswith("//"):
        return "user", s[1:]
    if s.startswith("/"):
        return "command", s.strip()
    return "user", text


def help_text() -> str:
    return "\n".join([*(f"{name:8} {desc}" for name, desc in COMMANDS.items()),
                      f"{'//TEXT':8} send a message that starts with / (one slash is dropped)"])
