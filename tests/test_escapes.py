"""Issue 45 item 5: text from a file, a model, a server or a store reaches the terminal, a log
line or an exported file with its control characters spelled out (model/escapes.py)."""

from __future__ import annotations

import io
import json
import struct

from chatapp.chat.events import Error
from chatapp.cli import main
from chatapp.headless import emit
from chatapp.store.export import ExportedChat, export, is_export
from model.escapes import escape_controls

HOSTILE = "a\x1b]0;owned\x07b\x1b[2J\x9b31m\rc\x7f\x00"


def test_every_control_character_is_spelled_out_and_nothing_else_changes():
    controls = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))]
    for c in controls:
        out = escape_controls(c)
        assert out.startswith("\\") and out.isprintable() and len(out) in (2, 4), repr(c)
    assert escape_controls(HOSTILE) == "a\\x1b]0;owned\\x07b\\x1b[2J\\x9b31m\\rc\\x7f\\x00"
    plain = "C:\\path ␛ naïve 日本 🙂 \\x1b already"
    assert escape_controls(plain) == plain


def test_one_line_unless_lines_are_kept():
    assert escape_controls("a\nb\tc") == "a\\nb\\tc"
    assert escape_controls("a\nb\tc\x1b", lines=True) == "a\nb\tc\\x1b"


def gguf_with_key(path, key: str):
    """A GGUF header whose one metadata key has an unknown value type: the header check quotes
    the key in its refusal."""
    raw = key.encode()
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(raw)) + raw
                     + struct.pack("<I", 99) + b"\0" * 64)
    return path


def test_an_error_quoting_a_gguf_key_reaches_stderr_escaped(tmp_path, capsys):
    """The issue's case: a metadata key holding a terminal title write and a screen clear."""
    path = gguf_with_key(tmp_path / "m.gguf", "general.\x1b]0;owned\x07\x1b[2J")
    assert main(["--headless", "--no-store", "--model", str(path)]) == 1
    err = capsys.readouterr().err
    assert "\\x1b]0;owned\\x07" in err and "unknown value type" in err
    assert err.isprintable() or err.rstrip("\n").isprintable()
    assert err.count("\n") == 1


def test_an_export_spells_out_a_replys_escapes_and_keeps_its_text(tmp_path):
    """The issue's case: a reply's raw bytes went into the /export file, which `cat` then ran."""
    reply = "line one\x1b]52;c;cm0gLXJmIH4=\x07\n\tindented\r\nlast \x9b2J"
    t = ExportedChat("title \x1b[31m", "m", "", [("hi\r\nthere", reply, "", [])])
    text = export(t, str(tmp_path / "c.md")).read_text()
    assert "\x1b" not in text and "\x9b" not in text and "\r" not in text and "\x07" not in text
    assert "line one\\x1b]52;c;cm0gLXJmIH4=\\x07\n\tindented\nlast \\x9b2J" in text
    assert "# title \\x1b[31m" in text and "hi\nthere" in text
    assert is_export(tmp_path / "c.md")  # a later /export may still overwrite it


def test_headless_json_lines_escape_del_and_c1_and_keep_the_value():
    """json.dumps escapes C0 (ESC included) but left DEL and C1 raw: 0x9b is a CSI to a terminal."""
    out = io.StringIO()
    emit(Error(HOSTILE), out)
    line = out.getvalue()
    assert line.endswith("\n") and line[:-1].isprintable() and "\\u009b" in line and "\\u001b" in line
    assert json.loads(line)["message"] == HOSTILE
