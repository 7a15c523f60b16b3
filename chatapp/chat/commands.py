"""The one table of `/commands`, and parsing them with one-line errors.

`/help`, the TUI's palette and help screen, headless mode and docs/tui.md all read `TABLE`.
Adding a command is one entry here plus its handler: a method of `Session` (the conversation)
or of `ChatKeeper` (`store=True`: it needs the stored chats), named by `handler`, taking the
argument text and yielding events; a handler refuses by raising UserError (see `run_handler`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from chatapp.chat.events import Error, Event
from model.errors import UserError


@dataclass(frozen=True)
class CommandSpec:
    name: str
    help: str
    arg: str = ""        # "" takes none; "TEXT" needs one; "[TEXT]" may have one
    handler: str = ""    # the method that serves it (Session's, or ChatKeeper's when store=True)
    store: bool = False  # served by the keeper; refused when chats are not stored
    screen: str = ""     # the TUI action that serves it when it comes without an argument
    key: str = ""        # the TUI's key for it: /help names it, the TUI's own lists show it as a key
    tui: bool = False    # the TUI serves it with an argument too (action_{screen}(arg)); headless refuses

    def help_for(self, tui: bool) -> str:
        """Its help where it is read: the TUI's palette shows the key itself, /help elsewhere says it."""
        return self.help if tui or not self.key else f"{self.help} ({self.key} in the TUI)"

    @property
    def usage(self) -> str:
        return f"{self.name} {self.arg}".strip()

    @property
    def needs_arg(self) -> bool:
        return bool(self.arg) and not self.arg.startswith("[")


TABLE = [
    CommandSpec("/reset", "start a new chat: empty the cache and the transcript", handler="reset_chat"),
    CommandSpec("/retry", "rewind to before the last reply and generate it again", handler="retry"),
    CommandSpec("/undo", "remove the last exchange", handler="undo"),
    CommandSpec("/system", "set the system prompt (starts a new chat)", "TEXT", handler="set_system"),
    CommandSpec("/preset", "system-prompt presets: alone, list them; /preset NAME starts a chat with one; /preset "
                "save NAME keeps the current system prompt; /preset delete NAME", "[NAME]", handler="preset",
                store=True),
    CommandSpec("/set", "show the settings, or change them: /set temperature 0.7, or several as /set "
                "temperature=0.7 top_k=50 top_p=0.9 min_p=0.05 repetition_penalty=1.1 presence_penalty=0 "
                "frequency_penalty=0 repeat_last_n=64 seed=1 max_new_tokens=512 (none: no cap, the default) "
                "low_water=0.5 (a full context is trimmed to that share)",
                "[NAME=VALUE ...]", handler="change_settings"),
    CommandSpec("/stats", "show the cache, the settings and the last turn's figures", handler="show_stats"),
    CommandSpec("/help", "list commands and keys", handler="show_help", screen="help"),
    CommandSpec("/save", "save this chat now (chats are also saved after every turn)", "[TITLE]",
                handler="save", store=True),
    CommandSpec("/load", "open a stored chat (default: the last one)", "[ID]", handler="load", store=True,
                screen="chats"),
    CommandSpec("/export", "write this chat as Markdown", "[PATH]", handler="export", store=True),
    CommandSpec("/quit", "leave", handler="quit", screen="quit"),
    CommandSpec("/edit", "rewind to message N and send TEXT in its place; the old continuation stays stored "
                "as a branch", "N TEXT", handler="edit", store=True, key="Ctrl+E"),
    CommandSpec("/copy", "copy a reply's text to the clipboard, or tmux's buffer (default: the last; N: the Nth "
                "reply of the chat, -N: N back)", "[N]", handler="copy_reply"),
    CommandSpec("/raw", "show a reply's raw text, without Markdown (default: the last; N and -N as for /copy; "
                "r in the transcript too)", "[N]", handler="raw", store=True, screen="raw", tui=True),
    CommandSpec("/file", "attach a text file to the next message (alone: list them; /file --clear drops them)",
                "[PATH]", handler="attach_file"),
    CommandSpec("/theme", "change the TUI's colours (no NAME: the theme picker); the choice is kept in the "
                "config file", "[NAME]", handler="theme", store=True, screen="themes", tui=True),
    CommandSpec("/panel", "hide or show the cache panel (below 100 columns it is a one-line status)",
                handler="panel", store=True, screen="panel", key="F2"),
    CommandSpec("/model", "switch to another model, keeping the chat (no SPEC: list the models)", "[SPEC]",
                handler="switch_model", store=True, screen="models"),
]
COMMANDS = {c.name: c for c in TABLE}


@dataclass
class Command:
    """A parsed command line: what a face hands its keeper (`keeper.run`), parsed once."""
    spec: CommandSpec
    arg: str = ""

    @property
    def name(self) -> str:
        return self.spec.name

    @classmethod
    def of(cls, name: str, arg: str = "") -> Command:
        """One a face makes itself (the chats screen's open is `/load ID`)."""
        return cls(COMMANDS[name], arg)


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
    spec = COMMANDS.get(name.lower())
    if spec is None:
        raise UserError(f"unknown command {name.lower()}; try /help")
    arg = arg.strip()
    if spec.needs_arg and not arg:
        raise UserError(f"{spec.name} needs an argument: {spec.usage}")
    if not spec.arg and arg:
        raise UserError(f"{spec.name} takes no argument")
    return Command(spec, arg)


def run_handler(handler: Callable[[str], Iterator[Event]], arg: str) -> Iterator[Event]:
    """A handler's events; a UserError it raises becomes its one-line refusal."""
    try:
        yield from handler(arg)
    except UserError as e:
        yield Error(str(e))


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


def parse_input(text: str) -> Command | str:
    """A typed line: the message to send, or its command parsed (UserError: malformed, in the
    one line every face shows)."""
    kind, body = split_input(text)
    return parse_command(body) if kind == "command" else body


def completions(text: str) -> list[str]:
    """What Tab may complete a typed `/comm` to: the table's names that start with it, each with
    a space when it takes an argument (the argument comes next). None for a message or a line
    that already has its command name (a space typed)."""
    if not text.startswith("/") or text.startswith("//") or any(c.isspace() for c in text):
        return []
    return [c.name + (" " if c.arg else "") for c in TABLE if c.name.startswith(text.lower())]


def help_rows(tui: bool = False) -> list[tuple[str, str]]:
    return [*((c.usage, c.help_for(tui) + (f" ({c.key})" if tui and c.key else "")) for c in TABLE),
            ("//TEXT", "send a message that starts with / (one slash is dropped)")]


def help_text() -> str:
    rows = help_rows()
    width = max(len(u) for u, _ in rows) + 2
    return "\n".join(f"{u:<{width}}{h}" for u, h in rows)
