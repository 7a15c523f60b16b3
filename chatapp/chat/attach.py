"""`/file PATH` and large pastes: text attached to the next message.

An attachment is checked when it is attached (a readable file, UTF-8 text, small enough for the
context as the model's own tokenizer counts it), so the refusal comes at once, in one line, and
not when the message is sent. The message then carries the attachments inside the user's turn:
it goes through the normal send path, so the cache invariant and the store see one ordinary
(long) user message, and a reopened chat still has the files.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from chatapp.chat.commands import is_text
from chatapp.chat.events import Event, Info
from model.errors import UserError
from model.files import read_bytes

MAX_READ = 64 << 20  # never read more than this: no context holds a file that large
BYTES_PER_TOKEN = 32  # no tokenizer packs more into a token: longer files are refused uncounted
CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")  # not \t \n \f \r
PASTED = "pasted text"


@dataclass(frozen=True)
class Attachment:
    name: str
    text: str

    @property
    def block(self) -> str:
        """The file fenced, its name as the info string; the fence outgrows any backtick run inside."""
        longest = max((len(run) for run in re.findall(r"`+", self.text)), default=0)
        fence = "`" * max(3, longest + 1)
        return f"{fence}{self.name}\n{self.text.rstrip(chr(10))}\n{fence}"


# a block as Attachment.block writes it, then wrap's blank line: its fence outgrows any backtick
# run in the text, so the first line that is the fence alone closes it
BLOCK = re.compile(r"(`{3,})([^`\n]*)\n(?:.*?\n)??\1(?:\n\n|$)", re.S)
TITLE_CHARS = 48


def chat_title(message: str | None) -> str:
    """A chat's title from its first message: the user's own words, not the files `wrap` put before
    them (a title read "```notes.py def main(): ..."); the files' names when there are no words."""
    if message is None:
        return "new chat"
    names = []
    while m := BLOCK.match(message):
        names.append(m[2])
        message = message[m.end():]
    words = " ".join(message.split()) or ", ".join(names) or "new chat"
    return words if len(words) <= TITLE_CHARS else words[:TITLE_CHARS - 1] + "…"


@dataclass(frozen=True)
class Budget:
    """What the session allows one message: `count(text)` its tokens, at most `room` of them."""

    count: Callable[[str], int]
    room: int
    hint: str  # what the user can do about a full context


@dataclass
class Attachments:
    """The files waiting for the next message."""

    files: list[Attachment] = field(default_factory=list)
    tokens: int = 0  # a message of only these files, as the tokenizer counts it

    def wrap(self, text: str) -> str:
        """The message as the model reads it: the files first, then what the user wrote about them."""
        return "\n\n".join([*(f.block for f in self.files), text]) if self.files else text

    def add(self, file: Attachment, budget: Budget) -> Info:
        """Attach `file` if a message holding it and the files before it fits the budget."""
        room, hint = budget.room, budget.hint
        size = len(file.text.encode("utf-8"))
        if size > room * BYTES_PER_TOKEN:
            raise UserError(f"{file.name}: too large for the context: {size_text(size)} is far more than "
                            f"the {room:,} tokens a message can hold ({hint})")
        need = budget.count(Attachments([*self.files, file]).wrap(""))
        own, left = need - self.tokens, room - self.tokens
        if need > room:
            beside = f" beside the {len(self.files)} file(s) already attached" if self.files else ""
            raise UserError(f"{file.name}: too large for the context: it needs {own:,} tokens, {left:,} fit"
                            f"{beside} ({hint})")
        self.files.append(file)
        self.tokens = need
        return Info(f"attached {file.name} ({size_text(size)}, {own:,} tokens) to the next message"
                    + (f"; with it: {self.summary}" if len(self.files) > 1 else ""), self.data())

    @property
    def summary(self) -> str:
        return f"{', '.join(f.name for f in self.files)} ({self.tokens:,} tokens)"

    def clear(self) -> None:
        self.files.clear()
        self.tokens = 0

    def data(self) -> dict:
        return {"attached": [{"name": f.name, "characters": len(f.text)} for f in self.files],
                "tokens": self.tokens}

    def listing(self) -> Info:
        if not self.files:
            return Info("no files attached (/file PATH attaches one to the next message)", self.data())
        return Info(f"attached to the next message: {self.summary}; /file --clear drops them", self.data())


def paste_command(att: Attachments, text: str, budget: Budget) -> Event:
    """A paste too large for the input box, attached like a file (both sessions' `attach_text`)."""
    if not is_text(text):
        raise UserError("the pasted text is not valid Unicode (it holds a lone surrogate); nothing was attached")
    return att.add(Attachment(PASTED, text), budget)


def file_command(att: Attachments, arg: str, budget: Budget) -> Iterator[Event]:
    """`/file PATH` attaches, `/file` lists, `/file --clear` drops them all."""
    if arg == "--clear":
        n = len(att.files)
        att.clear()
        yield Info(f"dropped {n} attached file(s)", att.data())
    elif not arg:
        yield att.listing()
    else:
        name = unquote(arg)
        try:
            yield att.add(Attachment(name, read_text(name)), budget)
        except UserError as e:
            raise UserError(f"/file {e}") from None


def unquote(arg: str) -> str:
    """A path pasted with its quotes (a file manager's drag and drop) names the file inside them."""
    if len(arg) > 1 and arg[0] == arg[-1] and arg[0] in "'\"":
        return arg[1:-1]
    return arg


def read_text(path: str) -> str:
    """A UTF-8 text file's contents (newlines made \\n); a one-line UserError for anything else."""
    try:  # the one regular-file gate: a FIFO would block the read forever, /dev/zero never end
        data = read_bytes(Path(path).expanduser(), "file to attach", MAX_READ)
    except RuntimeError as e:  # ~user with no such user
        raise UserError(f"{path}: not a usable path ({e})") from None
    if b"\0" in data:
        raise UserError(f"{path}: a binary file (it holds NUL bytes), not text")
    try:
        text = data.decode("utf-8-sig")  # -sig: a byte order mark is not part of the text
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start:,} is "
                        f"{e.reason})") from None
    if len(CONTROL.findall(text)) > max(8, len(text) // 100):  # valid UTF-8 by accident: a binary format
        raise UserError(f"{path}: looks binary (it is full of control characters), not text")
    return text.replace("\r\n", "\n")


def size_text(n: int) -> str:
    if n < 1000:
        return f"{n} bytes"
    return f"{n / 1e3:.1f} kB" if n < 1e6 else f"{n / 1e6:.1f} MB"
