"""Control characters made visible, so that text from a file, a model, a server or a store
reaches a terminal, a log line or an exported file as text, never as a control sequence.

ESC starts a terminal's sequences (colours, cursor moves, the window title, OSC 52's clipboard
write), a C1 byte such as 0x9b is a one-byte CSI, a bare CR or backspace overwrites what was
shown (issue 45). Each becomes its Python spelling (`\\x1b`, `\\r`): the text is all still there
and readable, and nothing in it acts on the terminal. Backslashes stay as they are, so ordinary
text (code, Windows paths) reads unchanged. A root leaf (it imports nothing of ours): the faces, serve, the
store's export and the model loaders all escape through this one function.
"""

from __future__ import annotations

import sys

_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
_CONTROLS = (*range(0x20), 0x7F, *range(0x80, 0xA0))  # C0 (ESC among them), DEL, C1


def _table(keep: str) -> dict[int, str]:
    return {c: _NAMED.get(chr(c), f"\\x{c:02x}") for c in _CONTROLS if chr(c) not in keep}


_JSON = {c: f"\\u{c:04x}" for c in (0x7F, *range(0x80, 0xA0))}  # json.dumps escapes C0 itself
_ONE_LINE = _table("")
_LINES = _table("\n\t")


def escape_controls(text: str, lines: bool = False) -> str:
    """`text` with every control character spelled out. The result is one line (an error, a log
    line) unless `lines`, which keeps newlines and tabs (an exported file, a multi-line message)."""
    return text.translate(_LINES if lines else _ONE_LINE)


def json_controls(line: str) -> str:
    """A line json.dumps wrote with ensure_ascii off, with DEL and C1 written as JSON escapes too
    (it leaves them raw, and 0x9b is a CSI to a terminal reading headless mode's output): the
    same JSON value, nothing in it that acts on a terminal."""
    return line.translate(_JSON)


def to_stderr(msg: object) -> None:
    """The one way a line reaches stderr: escaped, its own newlines kept."""
    print(escape_controls(str(msg), lines=True), file=sys.stderr)
