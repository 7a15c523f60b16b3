"""`/export`: a chat as Markdown, for reading and sharing (not for reloading: that is the store)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from chatapp.chat.events import ToolCall
from chatapp.store.export_files import relabel
from chatapp.store.records import StoreError
from chatapp.store.tempfiles import write_atomic
from model.escapes import escape_controls

# The last line of every export (invisible in rendered Markdown): a file that ends with it may be
# overwritten by a later /export; any other existing file is left alone.
MARK = "<!-- exported by nanochat-tui -->"


@dataclass
class ExportedChat:
    title: str
    model: str
    system: str
    turns: list[tuple[str, str, str, list[ToolCall]]] = field(default_factory=list)  # (user, reply, thinking, tools)
    chat_id: int | None = None
    created: float | None = None


def to_markdown(t: ExportedChat) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(t.created or time.time()))
    head = [f"# {t.title}", "", f"*{t.model}, {when}" + (f", chat {t.chat_id}*" if t.chat_id else "*"), ""]
    if t.system:
        head += ["## System", "", *quote(t.system), ""]
    body = []
    for user, reply, thinking, tools in t.turns:
        body += ["## User", "", relabel(user).rstrip(), "", "## Assistant", ""]
        if thinking:  # folded, as the app shows it
            body += ["<details><summary>thinking</summary>", "", thinking.strip(), "", "</details>", ""]
        body += [reply.rstrip(), ""]
        for call in tools:
            body += [f"- calculator: `{call.expr}` = `{call.result}`" if call.result is not None
                     else f"- calculator: `{call.expr}` (not a valid expression)"]
        if tools:
            body.append("")
    text = "\n".join(head + body).rstrip() + "\n\n" + MARK + "\n"
    # A reply's raw ESC would act on the terminal that cats the file (issue 45): spelled out, the
    # text all kept; a CRLF is a line end, not a control to show.
    return escape_controls(text.replace("\r\n", "\n"), lines=True)


def quote(text: str) -> list[str]:
    return [f"> {line}" if line else ">" for line in text.splitlines()]


def default_name(t: ExportedChat) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"nanochat-chat-{t.chat_id}.md" if t.chat_id else f"nanochat-chat-{stamp}.md"


def export(t: ExportedChat, dest: str = "") -> Path:
    """Write the Markdown to `dest` (a file or a folder; default: the current folder)."""
    try:
        path = Path(dest).expanduser() if dest else Path.cwd()
        if path.is_dir():
            path = path / default_name(t)
        if path.exists() and not path.is_file():  # /dev/full, a FIFO: never written, never read
            raise StoreError(f"/export: {path} is not a regular file; nothing was written (give a file name)")
        if path.exists() and not is_export(path):
            raise StoreError(f"/export: {path} exists and is not an earlier export; nothing was written "
                             "(give another name)")
        write_atomic(path, to_markdown(t).encode("utf-8"))  # whole or none: ENOSPC leaves no half file
    except OSError as e:
        raise StoreError(f"/export: cannot write {dest or 'here'}: {e.strerror or e}; nothing was kept") from None
    except (ValueError, RuntimeError) as e:  # a NUL byte in the path; ~user with no such user
        raise StoreError(f"/export: not a usable path {dest!r}: {e}") from None
    return path



def is_export(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(max(path.stat().st_size - 200, 0))
            return f.read().decode("utf-8", "replace").rstrip().endswith(MARK)
    except OSError:
        return False
